"""api/endpoints/images.py: a data URL's image, its kind and size from its header, and each refusal
naming the part."""

import base64
import struct

import pytest

from api.endpoints import images
from api.http.errors import APIError
from api.settings import Limits
from contract.media.images import MARKER, png

LIMITS = Limits()
PART = "messages[0].content[1].image_url.url"


def url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def test_a_png_data_url_is_read_with_its_size_and_hash():
    data = png(40, 30)
    image = images.read(url(data), PART, LIMITS)
    assert (image.kind, image.width, image.height, image.data) == ("png", 40, 30, data)
    assert len(image.sha256) == 64 and image.sha256 == images.read(url(data), PART, LIMITS).sha256


def _jpeg(w: int, h: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, h, w, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (_jpeg(640, 480), (640, 480)),
        (b"GIF89a" + struct.pack("<HH", 7, 9) + b"\x00" * 8, (7, 9)),
        (
            b"RIFF\x00\x00\x00\x00WEBPVP8X"
            + b"\x00" * 8
            + (99).to_bytes(3, "little")
            + (49).to_bytes(3, "little"),
            (100, 50),
        ),
        (
            b"RIFF\x00\x00\x00\x00WEBPVP8L" + b"\x00" * 4 + b"\x2f" + ((9) | (4 << 14)).to_bytes(4, "little"),
            (10, 5),
        ),
    ],
)
def test_jpeg_gif_and_webp_sizes_are_read_from_their_headers(data, size):
    assert images.size(data, images.kind(data)) == size


@pytest.mark.parametrize(
    "bad",
    [
        "https://example.com/cat.png",  # remote URLs are not fetched
        "data:image/png;base64,%%%",
        url(b"BM not an image"),
        url(b"\x89PNG\r\n\x1a\n"),  # a signature and no header
        url(png(1, 1)).replace("base64,", "base64,x"),
    ],
)
def test_what_is_not_an_image_is_a_400_naming_the_part(bad):
    with pytest.raises(APIError) as caught:
        images.read(bad, PART, LIMITS)
    assert caught.value.status == 400 and caught.value.param == PART


def test_too_many_bytes_pixels_or_images_are_refused():
    small = Limits(max_image_bytes=100, max_image_pixels=100, max_images=1)
    with pytest.raises(APIError, match="larger than 100 bytes"):
        images.read(url(png(40, 40)), PART, small)
    header_only = png(20, 20)[:33]  # the IHDR says 400 pixels
    with pytest.raises(APIError, match="over 100 pixels"):
        images.read(url(header_only), PART, small)
    one = images.read(url(png(2, 2)), PART, small)
    images.counted([one], "m", small)
    with pytest.raises(APIError) as caught:
        images.counted([one, one], "messages[1].content[0]", small)
    assert caught.value.param == "messages[1].content[0]"


def test_the_marker_is_reserved_beside_images():
    images.no_marker("plain", "m")
    with pytest.raises(APIError):
        images.no_marker(f"a {MARKER}", "messages[0].content[0]")
