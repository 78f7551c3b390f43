"""worker/engine/steps/sequence.py: a sequence's text up to its next image, and an image's start."""

from worker.engine.steps.sequence import Sequence


def _seq(fed: int) -> Sequence:
    s = Sequence(context=list(range(10)), sampler=None, room=10)  # type: ignore[arg-type]
    s.images = {2: [0] * 3, 6: [0] * 2}  # rows 2-4 and 6-7
    s.fed = fed
    return s


def test_text_left_stops_at_the_next_image():
    assert [_seq(fed).text_left() for fed in (0, 2, 5, 6, 8, 10)] == [2, 0, 1, 0, 2, 0]
    plain = Sequence(context=[1, 2, 3], sampler=None, room=1)  # type: ignore[arg-type]
    assert plain.text_left() == 3


def test_a_position_inside_an_image_goes_back_to_its_start():
    s = _seq(0)
    assert [s.image_at(p) for p in (0, 2, 3, 4, 5, 6, 7, 8)] == [0, 2, 2, 2, 5, 6, 6, 8]
