"""devstack.random_vision: the pair llama.cpp's mtmd reads, an image becoming 576-wide embeddings."""

import ctypes
import zlib

import numpy as np
import pytest
from gguf import GGUFReader

from devstack import random_model, random_vision
from worker.settings import default_model_path

pytestmark = pytest.mark.skipif(default_model_path() is None, reason="no SmolLM2 GGUF: run scripts/setup")


def test_the_vision_flag_writes_the_default_model_and_a_clip_mmproj_with_the_mlp_projector(tmp_path):
    random_model.main(["--vision", str(tmp_path)])
    assert (tmp_path / "model.gguf").resolve().read_bytes()[:4] == b"GGUF"
    reader = GGUFReader(tmp_path / "mmproj.gguf")
    fields = {name: f.contents() for name, f in reader.fields.items()}
    assert fields["general.architecture"] == "clip"
    assert fields["clip.projector_type"] == "mlp" and fields["clip.has_vision_encoder"] is True
    assert fields["clip.vision.projection_dim"] == 576
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
    shape = random_vision.VISION
    # ggml's order: (in, out)
    assert shapes["mm.2.weight"] == (shape.projector_hidden, 576)
    assert shapes["v.patch_embd.weight"] == (shape.patch_size, shape.patch_size, 3, shape.hidden)
    assert shapes["v.position_embd.weight"] == (shape.hidden, shape.patches)
    assert all(name.startswith(("v.", "mm.")) for name in shapes)


def test_writing_again_replaces_the_link(tmp_path):
    random_vision.write_pair(tmp_path)
    random_vision.write_pair(tmp_path, seed=1)
    assert (tmp_path / "model.gguf").resolve() == default_model_path().resolve()


def test_the_png_is_a_valid_rgb_image_of_its_size():
    data = random_vision.png(5, 3)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert int.from_bytes(data[16:20], "big") == 5 and int.from_bytes(data[20:24], "big") == 3
    idat = data[data.index(b"IDAT") + 4 : data.index(b"IEND") - 8]
    assert len(zlib.decompress(idat)) == 3 * (1 + 5 * 3)
    assert random_vision.png(5, 3, seed=1) != data


def _mtmd():
    try:
        from llama_cpp import mtmd_cpp
    except (ImportError, OSError, RuntimeError, FileNotFoundError) as exc:  # a build without libmtmd
        pytest.skip(f"llama-cpp-python built without mtmd (LLAVA_BUILD=OFF): {exc}")
    return mtmd_cpp


def test_llama_cpp_loads_the_pair_and_encodes_a_png_into_one_576_wide_row_per_patch(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    mtmd = _mtmd()
    text_path, mmproj_path = random_vision.write_pair(tmp_path)
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        str(text_path).encode(), llama_cpp.llama_model_default_params()
    )
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings = False, 1, False
    ctx = mtmd.mtmd_init_from_file(str(mmproj_path).encode(), model, params)
    assert ctx, "mtmd refused the pair"
    try:
        assert mtmd.mtmd_support_vision(ctx)
        rows = [_encode(mtmd, ctx, random_vision.png(40, 30, seed)) for seed in (0, 0, 1)]
    finally:
        mtmd.mtmd_free(ctx)
        llama_cpp.llama_model_free(model)
    shape = random_vision.VISION
    assert rows[0].shape == (shape.patches, 576)
    assert np.isfinite(rows[0]).all() and rows[0].std() > 0
    assert np.array_equal(rows[0], rows[1])  # the same bytes, the same embeddings
    assert not np.allclose(rows[0], rows[2])  # other pixels, others


def _encode(mtmd, ctx, image: bytes) -> np.ndarray:
    """The prompt's image chunk, encoded: (tokens, 576)."""
    buf = (ctypes.c_uint8 * len(image)).from_buffer_copy(image)
    bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(image), False)
    assert bitmap, "mtmd could not read the PNG"
    chunks = mtmd.mtmd_input_chunks_init()
    try:
        prompt = b"Look: " + mtmd.mtmd_default_marker() + b" What is it?"
        text = mtmd.mtmd_input_text(text=prompt, text_len=len(prompt), add_special=True, parse_special=True)
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1) == 0
        kinds = [
            mtmd.mtmd_input_chunk_get_type(mtmd.mtmd_input_chunks_get(chunks, i))
            for i in range(mtmd.mtmd_input_chunks_size(chunks))
        ]
        assert kinds == [
            mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT,
            mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE,
            mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT,
        ]
        chunk = mtmd.mtmd_input_chunks_get(chunks, 1)
        n = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        assert mtmd.mtmd_encode_chunk(ctx, chunk) == 0
        embd = mtmd.mtmd_get_output_embd(ctx)
        return np.ctypeslib.as_array(embd, shape=(n * 576,)).reshape(n, 576).copy()
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)
