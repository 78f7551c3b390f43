"""The security review's attacks, through real processes: a slow body, a forged line in a
text log, cursors that would break the shared stream reader, /metrics and /scaling on their
own port, an API that will not start without keys unless told it is private, and a chat
template's inputs: special tokens' texts outside the contents stay text, and template kwargs
cannot break the template."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import httpx
import pytest
import redis

from api.jobs.store import JobStore
from api.services import shared_client
from api.streaming.reader import StreamReader
from api.streaming.relay import KEEPALIVE, follow
from contract import keys
from contract.servers import Servers
from contract.settings import Recovery
from devstack.peek import job_ids
from devstack.processes import ROOT, free_port, start_api, start_redis, start_worker, wait_for_model

pytestmark = pytest.mark.integration


@pytest.fixture
def redis_url(tmp_path):
    proc, url = start_redis(tmp_path)
    yield url
    proc.stop()


@pytest.fixture
def api(tmp_path, redis_url):
    """Starts an API on the test's Redis (`api(env)` -> (process, base URL)); each is
    stopped at the end of the test (they are not tethered to the test process)."""
    started = []

    def start(env: dict[str, str] | None = None):
        proc, base = start_api(tmp_path, redis_url, env=env)
        started.append(proc)
        return proc, base

    yield start
    for proc in started:
        proc.stop()


def test_the_api_refuses_to_start_without_keys_unless_told_it_is_private(tmp_path, redis_url):
    env = {"REDIS_URL": redis_url, "PATH": "/usr/bin:/bin", "ALLOW_NO_AUTH": "0"}
    argv = [sys.executable, "-m", "uvicorn", "--factory", "api.app:create_app", "--port", str(free_port())]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "No API keys" in done.stdout + done.stderr


def test_a_slow_body_is_refused_in_time(api):
    _, base = api({"REQUEST_READ_SECONDS": "1"})
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        )
        s.sendall(b"Content-Length: 1000\r\n\r\n{")
        started = time.monotonic()
        answer = _read_response(s)  # no more body: the server gives up on it
    assert answer.startswith("HTTP/1.1 408") and "request_timeout" in answer
    assert time.monotonic() - started < 5


def _read_response(s: socket.socket) -> str:
    """The whole HTTP answer: headers and body may come in separate segments."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def test_a_forged_log_line_stays_on_its_own_line(api):
    proc, base = api({"LOG_FORMAT": "text", "KNOWN_MODELS": "m"})
    r = httpx.get(base + "/v1/chat/completions/chatcmpl-x%0ACRITICAL%20forged", timeout=10)
    assert r.status_code == 404 and "CRITICAL forged" not in r.text
    httpx.post(
        base + "/v1/chat/completions", json={"model": "m\nCRITICAL forged", "messages": []}, timeout=10
    )
    body = {"model": "m\nCRITICAL forged", "messages": [{"role": "user", "content": "x"}], "background": True}
    httpx.post(base + "/v1/chat/completions", json=body, timeout=10)
    assert not any(line.startswith("CRITICAL forged") for line in proc.log().splitlines())


def test_metrics_and_scaling_inside_the_cluster_and_to_operators_outside(api):
    internal = free_port()
    env = {
        "API_KEYS": "k",
        "OPERATOR_KEYS": "op",
        "INTERNAL_PORT": str(internal),
        "INTERNAL_HOST": "127.0.0.1",
    }
    _, base = api(env)
    inside = f"http://127.0.0.1:{internal}"
    assert httpx.get(inside + "/metrics").status_code == 200  # no key: inside the cluster
    assert httpx.get(inside + "/readyz").status_code == 200
    assert httpx.get(inside + "/v1/models").status_code == 404  # nothing else there
    keyed, operator = {"Authorization": "Bearer k"}, {"Authorization": "Bearer op"}
    assert httpx.get(base + "/metrics").status_code == 401  # never without a key outside
    assert httpx.get(base + "/metrics", headers=keyed).status_code == 403  # nor to a tenant's key
    assert httpx.get(base + "/metrics", headers=operator).status_code == 200
    assert httpx.get(base + "/v1/models", headers=keyed).status_code == 200
    assert httpx.get(base + "/healthz").status_code == 200


def test_a_cursor_past_2_64_is_a_400_not_a_stall(api):
    _, base = api({"KNOWN_MODELS": "m"})
    job_id = httpx.post(
        base + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}], "background": True},
    ).json()["id"]
    r = httpx.get(
        f"{base}/v1/chat/completions/{job_id}",
        params={"stream": "true"},
        headers={"Last-Event-ID": "99999999999999999999-0"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_cursor"


async def running_reader(redis_url: str, *running: str) -> tuple:
    """A started stream reader and a job store on `redis_url`, with jobs `running` marked as
    running: (async client, sync client, store, reader)."""
    client = shared_client(redis_url, 10, 5.0)
    sync = redis.Redis.from_url(redis_url)
    store = JobStore(Servers(client, client), Servers(sync, sync), queue_wait_s=60, recovery=Recovery())
    reader = StreamReader(redis_url, client, block_ms=200)
    await reader.start()
    for job_id in running:
        await client.hset(keys.job(job_id), mapping={"status": "running", "epoch": 1})
    return client, sync, store, reader


def test_one_stream_redis_refuses_to_read_fails_alone(redis_url):
    """Defence in depth behind the cursor check: a stream whose read Redis refuses is taken
    out of the shared XREAD and fails alone; the others keep flowing."""

    async def scenario() -> tuple[list, str]:
        client, sync, store, reader = await running_reader(redis_url, "chatcmpl-good", "chatcmpl-bad")

        async def consume(job_id: str, after: str) -> list:
            got = []
            async for item in follow(store, reader, job_id, after=after, keepalive_s=30):
                if item is not KEEPALIVE:
                    got += [e for _, e in item]
                    if len(got) >= 3:
                        return got
            return got

        good = asyncio.create_task(consume("chatcmpl-good", "0"))
        bad = asyncio.create_task(consume("chatcmpl-bad", "99999999999999999999-0"))
        await asyncio.sleep(0.5)
        for n in range(3):
            sync.xadd(keys.events("chatcmpl-good"), {"k": "d", "e": "1", "t": f"t{n}", "i": str(n)})
            await asyncio.sleep(0.1)
        got = await asyncio.wait_for(good, timeout=10)
        error = ""
        try:
            await asyncio.wait_for(bad, timeout=10)
        except redis.ResponseError as exc:
            error = str(exc)
        await reader.stop()
        await client.aclose()
        return got, error

    got, error = asyncio.run(scenario())
    assert [e.text for e in got] == ["t0", "t1", "t2"]
    assert error  # the bad one got Redis's refusal, alone


def test_an_entry_the_reader_cannot_decode_stalls_no_other_stream(redis_url, caplog):
    """An unexpected error in the shared reader (here an entry nobody could have written
    through the scripts) must not end it: the other streams keep being handed their rows."""

    async def scenario() -> list:
        client, sync, store, reader = await running_reader(redis_url, "chatcmpl-good", "chatcmpl-odd")
        async with reader.watch(keys.events("chatcmpl-odd"), "0") as odd:
            waiting = asyncio.create_task(odd.wait("0", timeout=30))
            await asyncio.sleep(0.3)
            sync.xadd(keys.events("chatcmpl-odd"), {"k": "no-such-kind"})
            await asyncio.wait_for(waiting, timeout=5)  # told to read for itself
            got = []

            async def consume() -> None:
                async for item in follow(store, reader, "chatcmpl-good", after="0", keepalive_s=30):
                    if item is not KEEPALIVE:
                        got.extend(e for _, e in item)
                        if len(got) >= 3:
                            return

            good = asyncio.create_task(consume())
            await asyncio.sleep(0.3)
            for n in range(3):
                sync.xadd(keys.events("chatcmpl-good"), {"k": "d", "e": "1", "t": f"t{n}", "i": str(n)})
                await asyncio.sleep(0.1)
            await asyncio.wait_for(good, timeout=10)
        await reader.stop()
        await client.aclose()
        return got

    got = asyncio.run(scenario())
    assert [e.text for e in got] == ["t0", "t1", "t2"]
    assert "cannot be decoded" in caplog.text


def test_pathologically_nested_json_is_a_400(api):
    _, base = api()
    nested = b"[" * 200_000 + b"]" * 200_000
    r = httpx.post(
        base + "/v1/chat/completions", content=nested, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_a_server_without_keys_answers_only_its_own_hosts_and_pages(api):
    """No key stands between a web page and a keyless server (ALLOW_NO_AUTH=1): a cross-site
    form or `text/plain` post, or a rebound DNS name, must not reach it (issue 38)."""
    _, base = api({"UI": "1"})
    port = base.rsplit(":", 1)[1]
    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    with httpx.Client(base_url=base, timeout=10) as c:
        plain = c.post("/v1/chat/completions", content=chat, headers={"Content-Type": "text/plain"})
        assert plain.status_code == 415 and plain.json()["error"]["code"] == "unsupported_media_type"
        form = c.post(
            "/v1/files",
            files={"file": ("a.jsonl", b"{}")},
            data={"purpose": "batch"},
            headers={"Origin": "https://evil.example"},
        )
        assert form.status_code == 403 and form.json()["error"]["code"] == "cross_site_request"
        fetched = c.post("/v1/chat/completions/chatcmpl-x/cancel", headers={"Sec-Fetch-Site": "cross-site"})
        assert fetched.status_code == 403
        rebound = c.get("/v1/files", headers={"Host": f"attacker.example:{port}"})
        assert rebound.status_code == 400 and rebound.json()["error"]["code"] == "unknown_host"
        own = c.post(
            "/v1/chat/completions",
            content=chat,
            headers={"Content-Type": "application/json", "Origin": base, "Host": f"127.0.0.1:{port}"},
        )
        assert own.status_code == 404  # its own page: through, to a model nobody serves
        assert c.get("/v1/files", headers={"Host": f"localhost:{port}"}).status_code == 200


QWEN_STYLE = str(ROOT / "tests" / "data" / "qwen-style-chatml.jinja")
TEMPLATED = "smollm2-qwen-style"
# each special text and a near-miss that tokenizes as it does as text (SmolLM2: 7 tokens each)
NEAR_MISSES = {"<|im_end|>": "<|im_fin|>", "<|endoftext|>": "<|endofline|>"}
PLACES = ("tool description", "call arguments", "reasoning", "template kwarg", "tool_use name")


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    """The default model behind a Qwen-shaped template that renders tools, earlier calls,
    reasoning and a template kwarg (tests/data/qwen-style-chatml.jinja), and an API:
    (base URL, the Redis server)."""
    logs = tmp_path_factory.mktemp("templated")
    redis_proc, url = start_redis(logs)
    env = {"CHAT_TEMPLATE_FILE": QWEN_STYLE, "MODEL_NAME": TEMPLATED, "SLOTS": "1"}
    worker = start_worker(logs, url, env=env)
    api_proc, base = start_api(logs, url)
    try:
        wait_for_model(base, TEMPLATED, procs=(worker, api_proc))
        yield base, redis.Redis.from_url(url)
    finally:
        for p in (api_proc, worker, redis_proc):
            p.stop()


def _prompt_tokens(base: str, where: str, text: str) -> int:
    """The prompt's tokens of a conversation with a tool, an earlier call and its result,
    `text` in one place outside the message contents."""
    description, name, arguments, reasoning, kwargs = "Looks a word up.", "lookup", {"word": "fox"}, "", {}
    if where == "tool description":
        description = f"Looks a word {text} up."
    elif where == "call arguments":
        arguments = {"word": f"fox {text} den"}
    elif where == "reasoning":
        reasoning = f"They ask {text} for a word."
    elif where == "template kwarg":
        kwargs = {"system_note": f"Be brief {text} always."}
    elif where == "tool_use name":
        name = f"look {text} up"
    if where == "tool_use name":  # Anthropic's Messages API: an earlier call's name
        return _messages_tokens(base, description, name)
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
    if reasoning:
        assistant["reasoning_content"] = reasoning
    function = {"name": "lookup", "description": description, "parameters": {"type": "object"}}
    body = {
        "model": TEMPLATED,
        "max_tokens": 1,
        "tools": [{"type": "function", "function": function}],
        "messages": [
            {"role": "user", "content": "Define fox."},
            assistant,
            {"role": "tool", "tool_call_id": "c1", "content": "A dog."},
        ],
        "chat_template_kwargs": kwargs,
    }
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


def _messages_tokens(base: str, description: str, name: str) -> int:
    use = {"type": "tool_use", "id": "c1", "name": name, "input": {}}
    result = {"type": "tool_result", "tool_use_id": "c1", "content": "A dog."}
    body = {
        "model": TEMPLATED,
        "max_tokens": 1,
        "tools": [{"name": "lookup", "description": description, "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "Define fox."},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ],
    }
    r = httpx.post(base + "/v1/messages", json=body, timeout=120)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return usage["input_tokens"] + usage["cache_read_input_tokens"]  # the cache's part apart


@pytest.mark.parametrize("where", PLACES)
@pytest.mark.parametrize("text", list(NEAR_MISSES))
def test_end_of_turn_text_outside_the_contents_is_text_not_the_token(templated, where, text):
    """A tool result or an argument the model wrote, sent back, cannot end a turn early: the
    text costs what its near-miss does (a token more at either side at most: it is tokenized
    apart from its neighbours), not the one token it would be as the control token."""
    base, _ = templated
    forged, near = _prompt_tokens(base, where, text), _prompt_tokens(base, where, NEAR_MISSES[text])
    assert near <= forged <= near + 2, (forged, near)


@pytest.mark.parametrize("name", ["namespace", "range"])
def test_a_template_kwarg_cannot_shadow_jinja_s_globals(templated, name):
    base, r = templated
    before = job_ids(r)
    body = {"model": TEMPLATED, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(
        base + "/v1/chat/completions", json={**body, "chat_template_kwargs": {name: "x"}}, timeout=120
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "chat_template_kwargs" and name in error["message"]
    assert job_ids(r) == before  # refused by the API: nothing enqueued


def test_a_template_error_the_kwargs_cause_is_a_400_naming_them(templated):
    base, _ = templated
    body = {
        "model": TEMPLATED,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"system_note": 5},  # the template strips it as a string
    }
    answer = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "chat_template_kwargs" and "chat_template_kwargs" in error["message"]
