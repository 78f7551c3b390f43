"""Image parts of a request, read before its job is queued.

A `data:` URL's bytes are checked to be a PNG, JPEG, WebP or GIF. The image may be at most
MAX_IMAGE_BYTES and MAX_IMAGE_PIXELS. Its pixels are read from its header: the image itself is
never decoded here. Images are named by their SHA-256, at most MAX_IMAGES a request. Each
refusal is a 400 naming the part. The bytes go to Redis with the job (`stored`). The worker
reads them by hash (contract/media/images.py)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import redis.asyncio as aredis

from api.endpoints import image_urls
from api.files.store import files_of, owned_file
from api.http.errors import APIError, invalid
from api.settings import Limits
from contract import errors, keys
from contract.media.images import MARKER, kind

if TYPE_CHECKING:
    from api.endpoints.body import Body

# the files a request may name as an image
IMAGE_PURPOSES = ("vision", "user_data")

_DATA_URL = re.compile(
    r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,", re.I
)


@dataclass(frozen=True)
class Image:
    sha256: str
    data: bytes
    kind: str
    width: int
    height: int
    # read at `detail: low` (contract.media.images.LOW_DETAIL_SIDE)
    low: bool = False

    def at(self, detail: str | None) -> Image:
        """The image as its part's `detail` asks it read. `low` shrinks it, the rest do not."""
        return replace(self, low=detail == "low")


def low_detail(found: list[Image]) -> tuple[int, ...]:
    """The spec's `low_detail`: which of the request's images are read at low detail."""
    return tuple(i for i, image in enumerate(found) if image.low)


def size(data: bytes, what: str) -> tuple[int, int] | None:
    """(width, height) from an image's header (None: no header this reader knows)."""
    try:
        if what == "png" and data[12:16] == b"IHDR":
            return struct.unpack(">II", data[16:24])
        if what == "gif":
            return struct.unpack("<HH", data[6:10])
        if what == "webp":
            return _webp(data)
        if what == "jpeg":
            return _jpeg(data)
    except struct.error:
        return None
    return None


def _webp(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L" and data[20:21] == b"\x2f":
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


def _jpeg(data: bytes) -> tuple[int, int] | None:
    """The frame header's size: the first SOFn segment's (not DHT, JPG or DAC: C4, C8, CC)."""
    i = 2
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        # fill bytes
        if marker == 0xFF:
            i += 1
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h, w = struct.unpack(">HH", data[i + 5 : i + 9])
            return w, h
        # no length
        if marker == 0xD8 or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        i += 2 + length
    return None


def read(url: str, param: str, limits: Limits, fetched: dict[str, bytes] | None = None) -> Image:
    """A `data:` URL's image, or a remote URL's, or a 400 naming `param`. A remote URL's image is
    the one the endpoint fetched before (api/endpoints/image_urls.py, `fetched`)."""
    if fetched and url in fetched:
        return checked(fetched[url], param, limits)
    match = _DATA_URL.match(url)
    if match is None:
        remote = " (IMAGE_URL_HOSTS lets the server fetch http(s) URLs from the hosts it names)"
        raise invalid(
            f"Invalid '{param}': only data: URLs of base64 PNG, JPEG, WebP or GIF images are taken "
            f"here{remote if image_urls.is_remote(url) and not limits.image_url_hosts else ''}.",
            param=param,
        )
    body = url[match.end() :]
    most = limits.max_image_bytes
    if len(body) > (most + 2) // 3 * 4 + 4:
        raise invalid(f"Invalid '{param}': the image is larger than {most} bytes.", param=param)
    try:
        data = base64.b64decode(body, validate=True) if match["b64"] else body.encode("latin-1")
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise invalid(f"Invalid '{param}': the data URL is not valid base64.", param=param) from None
    return checked(data, param, limits)


def checked(data: bytes, param: str, limits: Limits) -> Image:
    """Bytes as an Image, or a 400 naming `param`. The bytes are a data URL's or an uploaded file's."""
    if len(data) > (most := limits.max_image_bytes):
        raise invalid(f"Invalid '{param}': the image is larger than {most} bytes.", param=param)
    what = kind(data)
    dims = size(data, what) if what else None
    if what is None or dims is None or not all(dims):
        raise invalid(f"Invalid '{param}': the bytes are not a PNG, JPEG, WebP or GIF image.", param=param)
    if dims[0] * dims[1] > (most := limits.max_image_pixels):
        raise invalid(
            f"Invalid '{param}': the image is {dims[0]}x{dims[1]}, over {most} pixels.", param=param
        )
    return Image(hashlib.sha256(data).hexdigest(), data, what, *dims)


def counted(images: list[Image], param: str, limits: Limits) -> None:
    """A 400 naming the first part beyond MAX_IMAGES."""
    if len(images) > limits.max_images:
        raise invalid(f"Invalid '{param}': at most {limits.max_images} images a request.", param=param)


def no_marker(text: str, param: str) -> None:
    """A request with images may not hold the image marker in its own text. The marker stands for an image."""
    if MARKER in text:
        raise invalid(
            f"Invalid '{param}': the text {MARKER!r} is reserved where images are sent.", param=param
        )


async def file_bytes(client: aredis.Redis, file_id: str, owner: str, param: str) -> bytes:
    """The content of a file `owner` uploaded for images (purpose `vision` or `user_data`). Else a
    404 naming `param`: no such file, another key's, or one of another purpose."""
    files = files_of(client)
    record = await owned_file(files, file_id, owner)
    data = await files.content(record.id) if record and record.purpose in IMAGE_PURPOSES else None
    if data is None:
        raise APIError(errors.NOT_FOUND, f"No file found with id '{file_id[:80]}'.", param=param)
    return data


async def kept(
    client: aredis.Redis, scope: str, hashes: list[str], low: set[int], param: str, limits: Limits
) -> list[Image]:
    """Images an earlier job of `scope` sent, read back by hash. Those at indices `low` are read at
    low detail. A later turn sends them again with its own job. A 400 naming `param` where one is no
    longer kept (JOB_TTL_SECONDS)."""
    found = []
    for i, sha in enumerate(hashes):
        data = await client.get(keys.image(scope, sha))
        if data is None:
            raise invalid(
                f"Invalid '{param}': its images are no longer kept; send the conversation again.", param=param
            )
        found.append(checked(data, param, limits).at("low" if i in low else None))
    return found


async def fetch_remote(body: Body, vision: bool, limits: Limits) -> None:
    """The request's remote image URLs, fetched for `to_spec` to read. They are fetched where
    IMAGE_URL_HOSTS allows it (api/endpoints/image_urls.py). None are fetched for a model that reads
    no images: `store` refuses it. A part that fails is a 400 naming it."""
    remote = [(url, at) for url, at in body.image_urls() if image_urls.is_remote(url)]
    if remote and vision and limits.image_url_hosts:
        body._fetched = await image_urls.fetched(remote, limits)


async def store(client: aredis.Redis, body: Body, scope: str, vision: bool, ttl: int) -> None:
    """A 400 naming the first image part when no worker of the model reads images. Else each image's
    bytes that `to_spec` read go to Redis, by hash (contract/media/images.py). They go within the
    job's cache `scope`, kept as long as a job may run. An image a job of its scope sent before
    lives on with this one."""
    if not vision:
        at = body._image_params[0]
        raise invalid(f"Invalid '{at}': the model '{body.model}' does not read images.", param=at)
    async with client.pipeline(transaction=False) as pipe:
        for image in body._images:
            pipe.set(keys.image(scope, image.sha256), image.data, ex=ttl)
        await pipe.execute()
