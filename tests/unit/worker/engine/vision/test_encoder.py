"""worker/engine/vision/encoder.py on the random pair (devstack/random_vision.py): `detail: low`
reads the image shrunk, and is cached apart from the image at full size."""

import random

import numpy as np
import pytest

from contract.media.images import LOW_DETAIL_SIDE, png, png_of
from devstack import random_vision
from worker.engine.vision.resize import fitted, shrunk
from worker.settings import default_model_path

pytestmark = pytest.mark.skipif(default_model_path() is None, reason="no SmolLM2 GGUF: run scripts/setup")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    llama_cpp = pytest.importorskip("llama_cpp")
    try:
        from worker.engine.vision.encoder import Encoder, VisionError
    except ImportError as exc:
        pytest.skip(f"no llama_cpp: {exc}")
    text_path, mmproj_path = random_vision.write_pair(tmp_path_factory.mktemp("pair"))
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        str(text_path).encode(), llama_cpp.llama_model_default_params()
    )
    try:
        enc = Encoder(mmproj_path, model, 2, False, cache_images=4)
    except VisionError as exc:
        llama_cpp.llama_model_free(model)
        pytest.skip(str(exc))
    yield enc
    enc.close()
    llama_cpp.llama_model_free(model)


def rows(pieces) -> np.ndarray:
    (block,) = [p for p in pieces if isinstance(p, np.ndarray)]
    return block


def test_a_low_detail_image_is_read_as_the_same_image_shrunk_first(encoder):
    width, height = 1200, 700
    pixels = random.Random(3).randbytes(width * height * 3)
    big = png_of(pixels, width, height)
    small_size = fitted(width, height, LOW_DETAIL_SIDE)
    small = shrunk(np.frombuffer(pixels, np.uint8).reshape(height, width, 3), *small_size)
    low = rows(encoder.pieces(big, "scope", "big:low", low=True))
    assert np.allclose(low, rows(encoder.pieces(png_of(small.tobytes(), *small_size))), atol=1e-5)
    assert not np.allclose(low, rows(encoder.pieces(big, "scope", "big")))


def test_an_image_that_fits_reads_the_same_at_either_detail(encoder):
    image = png(300, 200, seed=5)
    assert np.array_equal(rows(encoder.pieces(image, low=True)), rows(encoder.pieces(image)))


def test_the_cache_keeps_an_image_and_its_low_detail_reading_apart(encoder):
    image = png(900, 900, seed=7)
    high = encoder.pieces(image, "s", "h")
    low = encoder.pieces(image, "s", "h:low", low=True)
    assert encoder.pieces(image, "s", "h") is high and encoder.pieces(image, "s", "h:low", low=True) is low
    assert not np.allclose(rows(high), rows(low))
