import numpy as np

from worker.engine.embedding.vectors import finish, pack


def test_a_vector_comes_out_at_unit_length_in_float32():
    v = finish(np.array([3.0, 4.0]))
    assert v.dtype == np.dtype("<f4") and v.tolist() == [0.6000000238418579, 0.800000011920929]


def test_dimensions_keep_the_leading_values_renormalised():
    v = finish(np.array([3.0, 4.0, 12.0]), dimensions=2)
    assert np.allclose(v, [0.6, 0.8]) and abs(np.linalg.norm(v) - 1) < 1e-6


def test_a_zero_vector_stays_zero():
    assert finish(np.zeros(3)).tolist() == [0.0, 0.0, 0.0]


def test_vectors_pack_one_after_another_little_endian():
    raw = pack([np.array([1.0], dtype="<f4"), np.array([-2.0], dtype="<f4")])
    assert raw == np.array([1.0, -2.0], dtype="<f4").tobytes() and len(raw) == 8
