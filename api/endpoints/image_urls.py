"""Remote image URLs, fetched by the API before the job is queued.

They are fetched only from the hosts that IMAGE_URL_HOSTS names. The worker never reaches out.
A request cannot make the API reach a host the operator did not list.

Each hop (the URL, then each redirect, at most MAX_REDIRECTS) is checked alike. Its scheme is
`http` or `https`, and its host is listed. Its name is resolved once and the connection made to
that address, so a second lookup cannot swap it. The address must be public. A private,
loopback or link-local address is reached only where the operator listed that very address.
The body is read up to MAX_IMAGE_BYTES, all hops within IMAGE_URL_SECONDS. Every refusal is a
400 naming the part.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from api.http.errors import invalid
from api.settings import Limits

MAX_REDIRECTS = 3
REMOTE = ("http://", "https://")


def is_remote(url: str) -> bool:
    return url[:8].lower().startswith(REMOTE)


def listed(host: str, hosts: tuple[str, ...]) -> bool:
    """Whether IMAGE_URL_HOSTS names `host`. A `*.` entry names any subdomain of it. An address
    names only itself."""
    host = host.lower().rstrip(".")
    address = _literal(host) is not None
    for entry in (h.strip().lower().rstrip(".") for h in hosts):
        if host == entry or (not address and entry.startswith("*.") and host.endswith(entry[1:])):
            return True
    return False


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_global and not ip.is_multicast


async def _address(host: str, port: int, param: str) -> str:
    """The one address `host` is reached at, or a 400."""
    # an address listed as itself: the operator's own choice
    if _literal(host) is not None:
        return host
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        why = f"Invalid '{param}': the host '{host[:80]}' could not be resolved."
        raise invalid(why, param=param) from None
    address = str(found[0][4][0])
    if not _public(address):
        raise invalid(
            f"Invalid '{param}': '{host[:80]}' resolves to a private address; list that address in "
            "IMAGE_URL_HOSTS to reach it.",
            param=param,
        )
    return address


async def fetched(urls: list[tuple[str, str]], limits: Limits) -> dict[str, bytes]:
    """The bytes at each (url, part) of a request, or a 400 naming the first part that fails.
    Nothing is fetched where IMAGE_URL_HOSTS is empty: `images.read` refuses the URL."""
    if not limits.image_url_hosts:
        return {}
    out: dict[str, bytes] = {}
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as client:
        for url, param in urls:
            if url not in out:
                out[url] = await fetch(client, url, param, limits)
    return out


async def fetch(client: httpx.AsyncClient, url: str, param: str, limits: Limits) -> bytes:
    """The bytes at `url`, or a 400 naming `param`."""
    try:
        async with asyncio.timeout(limits.image_url_s):
            return await _follow(client, url, param, limits)
    except TimeoutError:
        raise invalid(
            f"Invalid '{param}': the image was not fetched within {limits.image_url_s:g} s.", param=param
        ) from None


async def _follow(client: httpx.AsyncClient, url: str, param: str, limits: Limits) -> bytes:
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        host = parts.hostname or ""
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            port = 0
        if parts.scheme not in ("http", "https") or not host or not port:
            raise invalid(f"Invalid '{param}': only http(s) image URLs can be fetched.", param=param)
        if not listed(host, limits.image_url_hosts):
            raise invalid(
                f"Invalid '{param}': the host '{host[:80]}' is not one IMAGE_URL_HOSTS lets the "
                "server fetch from.",
                param=param,
            )
        address = await _address(host, port, param)
        netloc = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        pinned = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        # identity: a compressed body could expand past MAX_IMAGE_BYTES within one chunk
        host_header = parts.netloc.rpartition("@")[2]
        headers = {"Host": host_header, "Accept": "image/*", "Accept-Encoding": "identity"}
        try:
            async with client.stream(
                "GET", pinned, headers=headers, extensions={"sni_hostname": host}
            ) as response:
                if response.is_redirect and (location := response.headers.get("location")):
                    url = urljoin(url, location)
                    continue
                if response.status_code != 200:
                    raise invalid(
                        f"Invalid '{param}': fetching the image gave HTTP {response.status_code}.",
                        param=param,
                    )
                data = bytearray()
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > (most := limits.max_image_bytes):
                        why = f"Invalid '{param}': the image is larger than {most} bytes."
                        raise invalid(why, param=param)
                return bytes(data)
        except httpx.HTTPError:
            raise invalid(f"Invalid '{param}': the image could not be fetched.", param=param) from None
    raise invalid(f"Invalid '{param}': more than {MAX_REDIRECTS} redirects.", param=param)
