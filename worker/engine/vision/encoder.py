"""An mmproj (MMPROJ_PATH) loaded beside the text model. With llama.cpp's mtmd, an image's
bytes become the pieces the prompt holds in its place.

Each image is tokenized alone (`mtmd_tokenize` of the marker and its bitmap). From it mtmd gives
the text ids a model puts around an image, and the image chunk. The text ids are begin and end
tokens, where the model has them. `mtmd_encode_chunk` turns the chunk into rows of embeddings,
in one call that cannot be split.

Encoding runs on the job's thread, not the scheduler's, so the running streams step meanwhile.
It encodes one image at a time, as the mtmd context is not shared between threads. Encoded
images are kept by their hash within their cache scope, up to `cache_images` of them. So a
follow-up turn about the same image does not encode it again.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import OrderedDict
from pathlib import Path

import llama_cpp
import numpy as np

from contract.jobspec import JobSpec
from contract.media.images import LOW_DETAIL_SIDE, MARKER, names, png
from worker.engine.vision.prompt import Piece, Prompt, expand, fetched
from worker.engine.vision.resize import fitted, shrunk
from worker.errors import PromptRejected, PromptTooLong
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)


class VisionError(SystemExit):
    """The mmproj cannot be used with this model. It is said at start."""


class BadImage(ValueError):
    """mtmd could not read an image's bytes."""


class Encoder:
    def __init__(self, mmproj: Path, model, threads: int, use_gpu: bool, cache_images: int = 32) -> None:
        try:
            from llama_cpp import mtmd_cpp
        # FileNotFoundError is an OSError
        except (ImportError, OSError, RuntimeError) as exc:
            raise VisionError(f"MMPROJ_PATH needs llama-cpp-python built with libmtmd ({exc})") from None
        self._mtmd = mtmd = mtmd_cpp
        params = mtmd.mtmd_context_params_default()
        params.use_gpu, params.n_threads, params.print_timings = use_gpu, threads, False
        params.media_marker = MARKER.encode()
        self._ctx = mtmd.mtmd_init_from_file(str(mmproj).encode(), model, params)
        if not self._ctx:
            raise VisionError(f"mtmd could not load MMPROJ_PATH={mmproj} for this model")
        if not mtmd.mtmd_support_vision(self._ctx):
            raise VisionError(f"MMPROJ_PATH={mmproj} has no vision encoder")
        if mtmd.mtmd_decode_use_mrope(self._ctx):
            raise VisionError(f"MMPROJ_PATH={mmproj}: M-RoPE models are not supported yet")
        self.n_embd = llama_cpp.llama_model_n_embd(model)
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], list[Piece]] = OrderedDict()
        self._cache_images = cache_images
        # the most rows an image became (set by `probe`)
        self.max_tokens = 0

    def pieces(self, data: bytes, scope: str = "", name: str = "", low: bool = False) -> list[Piece]:
        """The image's pieces in a prompt: text ids (lists) and rows of embeddings (arrays).
        `name` is the image as the model reads it (contract.media.images.names). `low` is its
        `detail: low`."""
        key = (scope, name)
        with self._lock:
            if name and (held := self._cache.get(key)) is not None:
                self._cache.move_to_end(key)
                return held
            pieces = self._encode(data, low)
            if name:
                self._cache[key] = pieces
                while len(self._cache) > self._cache_images:
                    self._cache.popitem(last=False)
        return pieces

    def rows(self, pieces: list[Piece]) -> int:
        return sum(len(p) for p in pieces)

    def _bitmap(self, data: bytes, low: bool):
        """mtmd's bitmap of the image's pixels (decoded by mtmd), shrunk for `detail: low`."""
        mtmd = self._mtmd
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self._ctx, buf, len(data), False)
        if not bitmap:
            raise BadImage("the image's bytes could not be decoded")
        nx, ny = mtmd.mtmd_bitmap_get_nx(bitmap), mtmd.mtmd_bitmap_get_ny(bitmap)
        width, height = fitted(nx, ny, LOW_DETAIL_SIDE) if low else (nx, ny)
        if (width, height) == (nx, ny):
            return bitmap
        try:
            pixels = np.ctypeslib.as_array(mtmd.mtmd_bitmap_get_data(bitmap), shape=(ny, nx, 3))
            small = np.ascontiguousarray(shrunk(pixels, width, height))
        finally:
            mtmd.mtmd_bitmap_free(bitmap)
        out = small.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        # mtmd copies the pixels
        return mtmd.mtmd_bitmap_init(width, height, out)

    def _encode(self, data: bytes, low: bool = False) -> list[Piece]:
        mtmd = self._mtmd
        bitmap = self._bitmap(data, low)
        if not bitmap:
            raise BadImage("the image's pixels could not be shrunk")
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            text = MARKER.encode()
            prompt = mtmd.mtmd_input_text(
                text=text, text_len=len(text), add_special=False, parse_special=True
            )
            bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
            if (rc := mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(prompt), bitmaps, 1)) != 0:
                raise BadImage(f"mtmd_tokenize returned {rc}")
            pieces: list[Piece] = []
            for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                chunk = mtmd.mtmd_input_chunks_get(chunks, i)
                if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t()
                    ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    pieces.append([ids[j] for j in range(n.value)])
                    continue
                if mtmd.mtmd_decode_use_non_causal(self._ctx, chunk):
                    raise BadImage("this model reads images with non-causal attention: not supported yet")
                rows = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
                if (rc := mtmd.mtmd_encode_chunk(self._ctx, chunk)) != 0:
                    raise BadImage(f"mtmd_encode_chunk returned {rc}")
                embd = mtmd.mtmd_get_output_embd(self._ctx)
                flat = np.ctypeslib.as_array(embd, shape=(rows * self.n_embd,))
                pieces.append(flat.reshape(rows, self.n_embd).copy())
            return pieces
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bitmap)

    def probe(self, image: bytes) -> int:
        """Encode one image at start, so its kernels are loaded before the first job. The rows
        it became are what the worker announces an image may cost."""
        self.max_tokens = max(self.max_tokens, self.rows(self._encode(image)))
        log.info("vision: an image becomes %d tokens of %d floats", self.max_tokens, self.n_embd)
        return self.max_tokens

    def close(self) -> None:
        if self._ctx:
            self._mtmd.mtmd_free(self._ctx)
            self._ctx = None


def load(settings: WorkerSettings, model, threads: int) -> Encoder | None:
    """The worker's encoder, with one image encoded (`probe`). None without MMPROJ_PATH."""
    if settings.mmproj_path is None:
        return None
    use_gpu = bool(settings.n_gpu_layers) and llama_cpp.llama_supports_gpu_offload()
    encoder = Encoder(settings.mmproj_path, model, threads, use_gpu, settings.vision_cache_images)
    encoder.probe(png(512, 512))
    return encoder


def prompt_of(encoder: Encoder | None, spec: JobSpec, ids: list[int], n_ctx: int, fetch) -> Prompt:
    """A job's prompt with its images in place (`ids` holds IMAGE at each image part).

    Raises PromptRejected for a model without vision, an image gone from Redis, or one mtmd
    cannot read. Raises PromptTooLong when the images leave no room."""
    if encoder is None:
        raise PromptRejected("This model does not read images (its worker has no MMPROJ_PATH).", "messages")
    try:
        images = fetched(spec.images, lambda sha: fetch(spec.cache_scope, sha))
    except LookupError:
        raise PromptRejected(
            "An image of this request is no longer stored; send it again.", "messages"
        ) from None
    named = enumerate(zip(names(spec.images, spec.low_detail), images, strict=True))
    try:
        pieces = [
            (name, encoder.pieces(data, spec.cache_scope, name, i in spec.low_detail))
            for i, (name, (_, data)) in named
        ]
    except BadImage as exc:
        raise PromptRejected(f"An image could not be read: {exc}.", "messages") from None
    prompt = expand(ids, pieces)
    if len(prompt) >= n_ctx:
        raise PromptTooLong(len(prompt), n_ctx, "messages")
    return prompt
