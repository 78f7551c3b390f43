"""worker/engine/vision/resize.py: `detail: low` shrinks an image by an area filter."""

import numpy as np

from worker.engine.vision.resize import fitted, shrunk


def test_an_image_that_fits_is_kept_and_a_larger_one_keeps_its_aspect():
    assert fitted(512, 300, 512) == (512, 300)
    assert fitted(2048, 1024, 512) == (512, 256)
    assert fitted(1000, 3000, 512) == (171, 512)
    assert fitted(5000, 2, 512) == (512, 1)  # never a side of no pixels


def test_each_new_pixel_is_the_mean_of_the_pixels_it_covers():
    pixels = np.zeros((4, 4, 3), dtype=np.uint8)
    pixels[:2, :2] = 200  # the top left quarter bright
    pixels[2:, 2:, 0] = 101  # the bottom right quarter red
    small = shrunk(pixels, 2, 2)
    assert small.shape == (2, 2, 3) and small.dtype == np.uint8
    assert small[0, 0].tolist() == [200, 200, 200] and small[0, 1].tolist() == [0, 0, 0]
    assert small[1, 1].tolist() == [101, 0, 0]
    mixed = shrunk(np.array([[[0], [255]]], dtype=np.uint8), 1, 1)
    assert mixed.tolist() == [[[128]]]  # rounded, not cut


def test_shrinking_by_a_factor_that_is_not_whole_covers_every_source_pixel_once():
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(700, 1000, 3), dtype=np.uint8)
    small = shrunk(pixels, *fitted(1000, 700, 512))
    assert small.shape == (358, 512, 3)
    assert abs(float(small.mean()) - float(pixels.mean())) < 0.5  # no row or column lost or doubled
    assert np.array_equal(shrunk(pixels, 1000, 700), pixels)  # at its own size, itself
