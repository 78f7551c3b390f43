"""api/endpoints/image_urls.py against a real HTTP server on loopback: a listed host's image is
fetched; an unlisted host, a redirect off the list, a name that resolves to a private address,
too many bytes, redirects or seconds are each a 400 naming the part."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from api.endpoints import image_urls
from api.http.errors import APIError
from api.settings import Limits
from contract.media.images import png

IMAGE = png(8, 8)
PART = "messages[0].content[0].image_url.url"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path, port = self.path, self.server.server_address[1]
        if path.startswith("/to/"):  # /to/<url>: a redirect there
            self.send_response(302)
            self.send_header("Location", path[4:].replace("PORT", str(port)))
            self.end_headers()
        elif path == "/loop":
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.end_headers()
        elif path == "/slow":
            time.sleep(2)
            self.send_response(200)
            self.end_headers()
        elif path == "/big":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"x" * 5000)
        elif path == "/cat.png":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            self.wfile.write(IMAGE)
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


LISTED = replace(Limits(), image_url_hosts=("127.0.0.1",), image_url_s=1.0, max_image_bytes=1000)


def fetch(url: str, limits: Limits = LISTED) -> dict[str, bytes]:
    return asyncio.run(image_urls.fetched([(url, PART)], limits))


def refused(url: str, match: str, limits: Limits = LISTED) -> None:
    with pytest.raises(APIError, match=match) as caught:
        fetch(url, limits)
    assert caught.value.status == 400 and caught.value.param == PART


def test_a_listed_address_s_image_is_fetched(server):
    assert fetch(f"http://{server}/cat.png") == {f"http://{server}/cat.png": IMAGE}
    assert fetch(f"http://{server}/to/http://127.0.0.1:PORT/cat.png")  # a redirect on the list


def test_an_unlisted_host_or_a_redirect_off_the_list_is_refused(server):
    port = server.split(":")[1]
    refused(
        f"http://{server}/cat.png",
        "not one IMAGE_URL_HOSTS",
        replace(LISTED, image_url_hosts=("example.com",)),
    )
    refused(f"http://{server}/to/http://127.0.0.2:PORT/cat.png", "'127.0.0.2' is not one IMAGE_URL_HOSTS")
    # a name on the list that resolves to a private address: only that address, listed, reaches it
    named = replace(LISTED, image_url_hosts=("localhost", "127.0.0.1"))
    refused(f"http://localhost:{port}/cat.png", "resolves to a private address", named)
    refused(f"http://{server}/to/http://localhost:PORT/cat.png", "resolves to a private address", named)
    refused(f"ftp://{server}/cat.png", "only http")


def test_too_many_bytes_redirects_or_seconds_and_an_error_status_are_refused(server):
    refused(f"http://{server}/big", "larger than 1000 bytes")
    refused(f"http://{server}/loop", "more than 3 redirects")
    refused(f"http://{server}/slow", "not fetched within 1 s")
    refused(f"http://{server}/missing.png", "gave HTTP 404")
    refused("http://127.0.0.1:1/cat.png", "could not be fetched")  # nothing listens there


def test_nothing_is_fetched_unless_hosts_are_listed(server):
    assert fetch(f"http://{server}/cat.png", Limits()) == {}


@pytest.mark.parametrize(
    ("host", "hosts", "ok"),
    [
        ("img.example.com", ("*.example.com",), True),
        ("a.b.example.com", ("*.example.com",), True),
        ("example.com", ("*.example.com",), False),
        ("evilexample.com", ("*.example.com",), False),
        ("Example.COM.", ("example.com",), True),
        ("example.com.evil.org", ("example.com",), False),
        ("127.0.0.1", ("*.0.0.1",), False),  # an address is listed as itself only
        ("10.0.0.1", ("10.0.0.1",), True),
    ],
)
def test_the_list_names_hosts_and_their_subdomains(host, hosts, ok):
    assert image_urls.listed(host, hosts) is ok
