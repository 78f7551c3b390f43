"""Remote image URLs on real processes (api/endpoints/image_urls.py): the API, whose
IMAGE_URL_HOSTS lists the loopback address, fetches an image from an HTTP server in the test
for each surface's SDK, and reads it as the same image sent as a data URL; a host off the list
and a missing image are 400s naming the part."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from contract.media.images import png
from devstack.random_vision import VISION
from tests.integration.test_vision import KEY, MODEL, _ask, _sdk, base  # noqa: F401 (base: a fixture)

pytestmark = pytest.mark.integration


class _Images(BaseHTTPRequestHandler):
    """Serves IMAGES by path on loopback: the remote URLs the API fetches."""

    def do_GET(self) -> None:
        data = IMAGES.get(self.path)
        self.send_response(200 if data else 404)
        self.end_headers()
        self.wfile.write(data or b"")

    def log_message(self, *args: object) -> None:
        pass


IMAGES = {"/picture.png": png(48, 40, seed=3)}


@pytest.fixture(scope="module")
def images_at():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_remote_url_on_the_list_is_fetched_and_read_as_its_bytes_on_every_surface(base, images_at):  # noqa: F811
    import anthropic

    by_data = _ask(base, IMAGES["/picture.png"])
    part = {"type": "image_url", "image_url": {"url": f"{images_at}/picture.png"}}
    content = [{"type": "text", "text": "Describe this picture:"}, part]
    chat = _sdk(base).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=12, temperature=0
    )
    assert chat.usage.prompt_tokens == by_data.usage.prompt_tokens
    assert chat.choices[0].message.content == by_data.choices[0].message.content
    response = _sdk(base).responses.create(
        model=MODEL,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Describe this picture:"},
                    {"type": "input_image", "image_url": f"{images_at}/picture.png", "detail": "auto"},
                ],
            }
        ],
        max_output_tokens=4,
    )
    assert response.usage.input_tokens > VISION.patches
    client = anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0, timeout=120)
    source = {"type": "url", "url": f"{images_at}/picture.png"}
    message = client.messages.create(
        model=MODEL,
        max_tokens=4,
        messages=[{"role": "user", "content": [{"type": "image", "source": source}]}],
    )
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > VISION.patches
    # a host the list does not name, and a missing image: 400s naming the part
    for url, why in (
        (f"{images_at.replace('127.0.0.1', '127.0.0.2')}/picture.png", "IMAGE_URL_HOSTS"),
        (f"{images_at}/gone.png", "HTTP 404"),
    ):
        part["image_url"]["url"] = url
        with pytest.raises(openai.BadRequestError, match=why) as caught:
            _sdk(base).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=4
            )
        assert caught.value.body["param"] == "messages[0].content[1].image_url.url"
