"""Images in, on real processes: a worker with the random mmproj beside the default model
(devstack/random_vision.py), the API, valkey; the openai SDK sends chat `image_url` parts and
Responses `input_image` ones (a data URL, a file id; remote URLs: test_image_urls.py), the
anthropic SDK `image` blocks (in a user turn, in a
tool result). A GIF is read by its first frame."""

from __future__ import annotations

import base64
import io
import json

import openai
import pytest

from contract.media.images import png
from devstack.processes import start_api, start_redis, start_worker, wait_for_model
from devstack.random_vision import VISION, write_pair

pytestmark = pytest.mark.integration

MODEL = "vision"
KEY, OTHER = "sk-vision-a", "sk-vision-b"


def _has_mtmd() -> bool:
    try:
        from llama_cpp import mtmd_cpp  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        return False
    return True


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    if not _has_mtmd():
        pytest.skip("llama-cpp-python built without mtmd (LLAVA_BUILD=OFF)")
    logs = tmp_path_factory.mktemp("vision")
    text, mmproj = write_pair(logs / "pair")
    redis_proc, url = start_redis(logs)
    env = {"MODEL_PATH": str(text), "MMPROJ_PATH": str(mmproj), "MODEL_NAME": MODEL, "SLOTS": "2"}
    worker = start_worker(logs, url, env=env)
    api_env = {"KNOWN_MODELS": "blind", "API_KEYS": f"{KEY},{OTHER}", "IMAGE_URL_HOSTS": "127.0.0.1"}
    api, base = start_api(logs, url, env=api_env)
    try:
        wait_for_model(base, MODEL, procs=(worker, api), headers={"Authorization": f"Bearer {KEY}"})
        yield base
    finally:
        for p in (api, worker, redis_proc):
            p.stop()


def _sdk(base: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)


def _ask(base: str, image: bytes | None, model: str = MODEL):
    content: list[dict] = [{"type": "text", "text": "Describe this picture:"}]
    if image is not None:
        url = "data:image/png;base64," + base64.b64encode(image).decode()
        content.append({"type": "image_url", "image_url": {"url": url, "detail": "low"}})
    return _sdk(base).chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=12, temperature=0
    )


def test_an_image_adds_its_tokens_to_the_prompt_and_greedy_answers_are_stable(base):
    plain = _ask(base, None)
    first = _ask(base, png(48, 40, seed=3))
    again = _ask(base, png(48, 40, seed=3))
    assert first.usage.prompt_tokens == plain.usage.prompt_tokens + VISION.patches
    assert first.choices[0].message.content == again.choices[0].message.content
    assert first.usage.completion_tokens > 0


def test_bad_images_and_models_without_vision_are_400s_naming_the_part(base):
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(base, b"\x89PNG\r\n\x1a\n not really")
    assert caught.value.body["param"] == "messages[0].content[1].image_url.url"
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(base, png(8, 8), model="blind")
    assert caught.value.body["param"] == "messages[0].content[1]"


def test_a_messages_image_block_reads_as_the_same_image(base):
    import anthropic

    data = base64.b64encode(png(48, 40, seed=3)).decode()
    client = anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0, timeout=120)
    blocks = [
        {"type": "text", "text": "Describe this picture:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
    ]
    message = client.messages.create(
        model=MODEL, max_tokens=12, messages=[{"role": "user", "content": blocks}]
    )
    plain = client.messages.create(
        model=MODEL, max_tokens=12, messages=[{"role": "user", "content": blocks[:1]}]
    )

    def whole(usage) -> int:  # Anthropic's input_tokens leave out what the cache held
        return usage.input_tokens + (usage.cache_read_input_tokens or 0)

    assert whole(message.usage) == whole(plain.usage) + VISION.patches
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model=MODEL,
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}],
                }
            ],
        )


def test_a_gif_is_read_by_its_first_frame(base):
    from PIL import Image

    first, second = (Image.open(io.BytesIO(png(48, 40, seed=s))).convert("RGB") for s in (3, 4))
    out = io.BytesIO()
    first.save(out, format="GIF", save_all=True, append_images=[second], duration=100, loop=0)
    first_only = io.BytesIO()
    first.save(first_only, format="GIF")
    gif, still = (
        _ask_with(base, out.getvalue(), "image/gif"),
        _ask_with(base, first_only.getvalue(), "image/gif"),
    )
    assert gif.usage.prompt_tokens == _ask(base, None).usage.prompt_tokens + VISION.patches
    assert gif.choices[0].message.content == still.choices[0].message.content


def _ask_with(base: str, image: bytes, mime: str):
    url = f"data:{mime};base64," + base64.b64encode(image).decode()
    content = [
        {"type": "text", "text": "Describe this picture:"},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    return _sdk(base).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=12, temperature=0
    )


RESUME_WORKER = {"HEARTBEAT_WINDOW_SECONDS": "2", "RESUME_WAIT_SECONDS": "20", "STEP_DELAY_SECONDS": "0.05"}
RESUME_API = {"KEEPALIVE_SECONDS": "0.5", "REAPER_INTERVAL_SECONDS": "0.2", "REAPER_SETTLE_SECONDS": "1"}


def test_a_sigkill_mid_answer_resumes_to_the_tokens_of_an_uninterrupted_run(tmp_path):
    """The takeover worker reads the image's bytes from Redis again, encodes them and goes on
    from the exact token ids: the client's stream is the uninterrupted answer."""
    import json
    import signal
    import time

    import httpx
    import redis

    from contract import keys

    if not _has_mtmd():
        pytest.skip("llama-cpp-python built without mtmd (LLAVA_BUILD=OFF)")
    text, mmproj = write_pair(tmp_path / "pair")
    redis_proc, url = start_redis(tmp_path)
    env = {
        "MODEL_PATH": str(text),
        "MMPROJ_PATH": str(mmproj),
        "MODEL_NAME": MODEL,
        "SLOTS": "1",
        **RESUME_WORKER,
    }
    workers = {n: start_worker(tmp_path, url, name=n, env=env) for n in ("v1", "v2")}
    api, base = start_api(tmp_path, url, env=RESUME_API)
    r = redis.Redis.from_url(url)
    image = "data:image/png;base64," + base64.b64encode(png(32, 32, seed=7)).decode()
    body = {
        "model": MODEL,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Say:"},
                    {"type": "image_url", "image_url": {"url": image}},
                ],
            }
        ],
        "max_tokens": 40,
        "temperature": 0,
        "ignore_eos": True,
    }
    try:
        wait_for_model(base, MODEL, procs=(api, *workers.values()))
        while r.hlen(keys.worker_vision(MODEL)) < 2:
            time.sleep(0.1)
        whole = httpx.post(base + "/v1/chat/completions", json=body, timeout=120).json()
        expected = whole["choices"][0]["message"]["content"]
        got, killed = [], None
        with httpx.stream(
            "POST", base + "/v1/chat/completions", json={**body, "stream": True}, timeout=120
        ) as resp:
            for line in resp.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
                got.append(delta.get("content") or "")
                if killed is None and sum(1 for g in got if g) >= 8:
                    name = r.hget(keys.job(chunk["id"]), keys.JobField.WORKER).decode()
                    killed = workers[name]
                    killed.signal(signal.SIGKILL)
        assert killed is not None, "the answer ended before the kill"
        assert "".join(got) == expected
    finally:
        for p in (api, *workers.values(), redis_proc):
            p.stop()


def _data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def _respond(base: str, image: dict | None, key: str = KEY, **kw):
    content: list[dict] = [{"type": "input_text", "text": "Describe this picture:"}]
    if image is not None:
        content.append({"type": "input_image", "detail": "auto", **image})
    return _sdk(base, key).responses.create(
        model=MODEL,
        input=[{"role": "user", "content": content}],
        max_output_tokens=12,
        temperature=0,
        **kw,
    )


def test_a_responses_input_image_reads_as_chat_s_from_a_data_url_or_a_file_id(base):
    image = png(48, 40, seed=3)
    plain = _respond(base, None)
    by_url = _respond(base, {"image_url": _data_url(image)})
    assert by_url.usage.input_tokens == plain.usage.input_tokens + VISION.patches
    uploaded = _sdk(base).files.create(file=("shot.png", image), purpose="vision")
    assert uploaded.purpose == "vision"
    by_file = _respond(base, {"file_id": uploaded.id})
    assert by_file.usage.input_tokens == by_url.usage.input_tokens
    assert by_file.output_text == by_url.output_text
    assert _sdk(base).responses.input_items.list(by_file.id).data[0].content[1].file_id == uploaded.id
    # the next turn reads the earlier image again by its hash, from the key's own cache
    follow = _sdk(base).responses.create(
        model=MODEL,
        previous_response_id=by_file.id,
        input="And its colours?",
        max_output_tokens=4,
        temperature=0,
    )
    assert follow.usage.input_tokens > by_file.usage.input_tokens
    assert follow.usage.input_tokens_details.cached_tokens >= VISION.patches


def test_a_low_detail_image_is_its_own_prefix_and_stays_low_in_the_next_turn(base):
    image = {"image_url": _data_url(png(600, 400, seed=13)), "detail": "low"}
    low = _respond(base, image)
    fresh = _respond(base, {"image_url": _data_url(png(600, 400, seed=14))})
    before = fresh.usage.input_tokens_details.cached_tokens  # the text before an unseen image
    follow = _sdk(base).responses.create(
        model=MODEL, previous_response_id=low.id, input="And its colours?", max_output_tokens=4, temperature=0
    )
    assert follow.usage.input_tokens_details.cached_tokens >= before + VISION.patches  # read low again
    high = _respond(base, {**image, "detail": "high"})
    assert high.usage.input_tokens == low.usage.input_tokens  # this projector's size is fixed
    assert high.usage.input_tokens_details.cached_tokens == before  # other pixels: read again


def test_image_files_are_checked_and_only_their_key_names_them(base):
    with pytest.raises(openai.BadRequestError) as caught:
        _sdk(base).files.create(file=("x.png", b"not an image"), purpose="vision")
    assert caught.value.body["param"] == "file"
    mine = _sdk(base).files.create(file=("shot.png", png(8, 8)), purpose="user_data")
    with pytest.raises(openai.NotFoundError) as caught:
        _respond(base, {"file_id": mine.id}, key=OTHER)
    assert caught.value.body["param"] == "input[0].content[1].file_id"
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
    }
    batch = _sdk(base).files.create(file=("b.jsonl", json.dumps(line).encode()), purpose="batch")
    with pytest.raises(openai.NotFoundError):
        _respond(base, {"file_id": batch.id})
    with pytest.raises(openai.BadRequestError) as caught:
        _respond(base, {"image_url": "https://example.com/x.png"})
    assert caught.value.body["param"] == "input[0].content[1].image_url"


def test_a_tool_result_s_screenshot_counts_as_an_image(base):
    import anthropic

    client = anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0, timeout=120)
    shot = {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(png(40, 40)).decode(),
        },
    }
    tool = {"name": "screenshot", "input_schema": {"type": "object", "properties": {}}}

    def ask(result: list[dict]):
        turns = [
            {"role": "user", "content": "Take a screenshot."},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}],
            },
        ]
        usage = client.messages.create(model=MODEL, max_tokens=4, tools=[tool], messages=turns).usage
        return usage.input_tokens + (usage.cache_read_input_tokens or 0)

    text = {"type": "text", "text": "Here it is."}
    # This model's tool protocol sends a result as a JSON string (worker/tools/json_envelope.py):
    # the image splits it, so the text on either side may read as one token more.
    assert ask([text, shot]) - ask([text]) in (VISION.patches, VISION.patches + 1)


def test_concurrent_image_requests_answer_as_each_alone(base):
    """Two slots: the image requests share decode steps (each image's rows in decodes of their
    own), and greedy tokens do not depend on what runs beside them."""
    from concurrent.futures import ThreadPoolExecutor

    images = [png(32 + 8 * i, 32, seed=20 + i) for i in range(3)]
    alone = [_ask(base, image).choices[0].message.content for image in images]
    with ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda image: _ask(base, image).choices[0].message.content, images))
    assert together == alone


def test_a_follow_up_about_the_same_image_reads_it_from_the_key_s_cache_only(base):
    image = _data_url(png(40, 32, seed=11))
    first = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": image}},
            ],
        }
    ]
    answer = _sdk(base).chat.completions.create(model=MODEL, messages=first, max_tokens=6, temperature=0)
    turns = [
        *first,
        {"role": "assistant", "content": answer.choices[0].message.content},
        {"role": "user", "content": "And the colours?"},
    ]

    def cached(key: str) -> int:
        done = _sdk(base, key).chat.completions.create(
            model=MODEL, messages=turns, max_tokens=4, temperature=0
        )
        return done.usage.prompt_tokens_details.cached_tokens

    assert cached(KEY) >= VISION.patches
    assert cached(OTHER) < VISION.patches  # the same image from another key is read again


def test_a_follow_up_about_an_image_goes_to_the_worker_that_holds_it(tmp_path):
    """Two one-slot workers, three conversations of the same words about different images: the
    routing digests cover the images' hashes (contract/prefixes.py), so each follow-up goes to
    the worker that answered its first turn and reads its image from that slot's cache."""
    import redis

    from contract import keys

    if not _has_mtmd():
        pytest.skip("llama-cpp-python built without mtmd (LLAVA_BUILD=OFF)")
    text, mmproj = write_pair(tmp_path / "pair")
    redis_proc, url = start_redis(tmp_path)
    env = {"MODEL_PATH": str(text), "MMPROJ_PATH": str(mmproj), "MODEL_NAME": MODEL, "SLOTS": "1"}
    workers = [start_worker(tmp_path, url, name=n, env=env) for n in ("w1", "w2")]
    api, base = start_api(tmp_path, url)
    r = redis.Redis.from_url(url)
    sdk = _sdk(base)
    try:
        wait_for_model(base, MODEL, procs=(api, *workers))
        for i in range(3):
            image = _data_url(png(40, 32, seed=30 + i))
            first = [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": image}},
                    ],
                }
            ]
            answer = sdk.chat.completions.create(model=MODEL, messages=first, max_tokens=6, temperature=0)
            holder = r.hget(keys.job(answer.id), keys.JobField.WORKER)
            turns = [
                *first,
                {"role": "assistant", "content": answer.choices[0].message.content},
                {"role": "user", "content": "And the colours?"},
            ]
            follow = sdk.chat.completions.create(model=MODEL, messages=turns, max_tokens=4, temperature=0)
            assert r.hget(keys.job(follow.id), keys.JobField.WORKER) == holder, f"conversation {i}"
            assert follow.usage.prompt_tokens_details.cached_tokens >= VISION.patches, f"conversation {i}"
    finally:
        for p in (api, *workers, redis_proc):
            p.stop()
