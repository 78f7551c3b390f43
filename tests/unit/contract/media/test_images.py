"""contract.media.images: an image's signature, and the spec's `images` against its markers."""

import pytest

from contract.jobspec import InvalidSpec, JobSpec, Message
from contract.media import images
from devstack.random_vision import png

SHA = "a" * 64


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (png(2, 2), "png"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "jpeg"),
        (b"RIFF\x10\x00\x00\x00WEBPVP8 ", "webp"),
        (b"GIF89a\x01\x00\x01\x00", "gif"),
        (b"GIF87a\x01\x00\x01\x00", "gif"),
        (b"BM\x00\x00", None),
        (b"", None),
        (b"RIFF\x10\x00\x00\x00WAVE", None),
    ],
)
def test_the_kind_is_read_from_the_signature(data, kind):
    assert images.kind(data) == kind


def _spec(content: str, hashes: tuple[str, ...], kind: str = "chat") -> JobSpec:
    if kind == "text":
        return JobSpec(id="j", kind="text", model="m", prompt=content, images=hashes)
    return JobSpec(id="j", kind="chat", model="m", messages=(Message("user", content),), images=hashes)


def test_a_spec_names_one_image_per_marker_and_travels_as_a_list():
    spec = _spec(f"look {images.MARKER} and {images.MARKER}", (SHA, "b" * 64))
    data = spec.to_dict()
    assert data["images"] == [SHA, "b" * 64]
    assert JobSpec.from_dict(data) == spec
    assert "images" not in _spec("no image", ()).to_dict()  # an earlier worker takes it


@pytest.mark.parametrize(
    ("content", "hashes", "kind"),
    [
        (f"{images.MARKER} {images.MARKER}", (SHA,), "chat"),  # a marker without its image
        ("no marker", (SHA,), "chat"),
        (f"{images.MARKER}", ("A" * 64,), "chat"),  # not lower-case hex
        (f"{images.MARKER}", ("a" * 63,), "chat"),
        (f"{images.MARKER}", (SHA,), "text"),
    ],
)
def test_a_spec_whose_images_do_not_match_its_markers_is_refused(content, hashes, kind):
    with pytest.raises(InvalidSpec):
        _spec(content, hashes, kind).check()


def test_low_detail_names_its_images_by_index_and_travels_only_when_set():
    two = _spec(f"{images.MARKER} {images.MARKER}", (SHA, "b" * 64))
    low = JobSpec.from_dict({**two.to_dict(), "low_detail": [1]})
    assert low.low_detail == (1,) and JobSpec.from_dict(low.to_dict()) == low
    assert "low_detail" not in two.to_dict()
    assert images.names(low.images, low.low_detail) == [SHA, "b" * 64 + ":low"]
    for bad in ([2], [1, 0], [0, 0], ["0"], [True]):
        with pytest.raises(InvalidSpec, match="low_detail"):
            JobSpec.from_dict({**two.to_dict(), "low_detail": bad})


def test_text_that_holds_the_marker_in_a_job_without_images_is_plain_text():
    _spec(images.MARKER, ()).check()  # a worker reads it as text: only image jobs read markers
    assert images.problem((), [images.MARKER], "text") is None
