"""Images in, on real processes: a worker with the random mmproj beside the default model
(devstack/random_vision.py), the API, valkey; the openai SDK sends `image_url` parts."""

from __future__ import annotations

import base64

import openai
import pytest

from contract.media.images import png
from devstack.processes import start_api, start_redis, start_worker, wait_for_model
from devstack.random_vision import VISION, write_pair

pytestmark = pytest.mark.integration

MODEL = "vision"


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
    api, base = start_api(logs, url, env={"KNOWN_MODELS": "blind"})
    try:
        wait_for_model(base, MODEL, procs=(worker, api))
        yield base
    finally:
        for p in (api, worker, redis_proc):
            p.stop()


def _sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)


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
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=120)
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
