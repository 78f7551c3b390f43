"""Resumable streams across API replicas: Last-Event-ID replay, detached jobs, retention,
isolation between API keys, and the openai SDK parsing id-bearing events with keep-alives."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from devstack.processes import Proc, free_port, start_api, start_redis, start_worker, wait_for_model
from devstack.sse_contract import check_stream
from tests.hold import holding, holding_body
from tests.integration.conftest import MODEL
from tests.system import missing

pytestmark = pytest.mark.integration

KEY_A, KEY_B = "sk-alice", "sk-bob"
RETENTION = 6
ENV = {
    "API_KEYS": f"{KEY_A},{KEY_B}",
    "RETENTION_SECONDS": str(RETENTION),
    "KEEPALIVE_SECONDS": "0.3",
    "CANCEL_GRACE_SECONDS": "30",
}
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}
LONG = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]


@dataclass
class Replicas:
    logs: object
    url: str
    ports: tuple[int, int]
    apis: list[Proc]
    bases: list[str]
    worker: Proc

    def restart(self, i: int) -> None:
        self.apis[i].signal(signal.SIGKILL)
        self.apis[i].popen.wait()
        self.apis[i], self.bases[i] = start_api(
            self.logs, self.url, port=self.ports[i], name=f"api{i}", env=ENV
        )


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    logs = tmp_path_factory.mktemp("resume")
    redis_proc, url = start_redis(logs)
    # One slot: a test occupies the worker to keep the next request waiting in the queue.
    worker = start_worker(logs, url, env={"RETENTION_SECONDS": str(RETENTION), "SLOTS": "1"})
    ports = (free_port(), free_port())
    apis, bases = [], []
    for i, port in enumerate(ports):
        p, b = start_api(logs, url, port=port, name=f"api{i}", env=ENV)
        apis.append(p)
        bases.append(b)
    rep = Replicas(logs, url, ports, apis, bases, worker)
    try:
        wait_for_model(bases[0], MODEL, procs=(worker,), headers=A)
        yield rep
    finally:
        for p in (*rep.apis, worker, redis_proc):
            p.stop()


def events(raw: bytes) -> list[tuple[str | None, str]]:
    """(id, data) of every event; keep-alives (no id) are left out."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        if "id" in fields or fields["data"] == "[DONE]":
            out.append((fields.get("id"), fields["data"]))
    return out


def replay(
    base: str,
    job_id: str,
    headers: dict,
    cursor: str | None = None,
    query: str = "",
    path: str = "chat/completions",
) -> bytes:
    h = dict(headers)
    if cursor:
        h["Last-Event-ID"] = cursor
    with httpx.stream("GET", f"{base}/v1/{path}/{job_id}?stream=true{query}", headers=h, timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return r.read()


BODY = {
    "model": MODEL,
    "messages": LONG,
    "max_tokens": 80,
    "temperature": 0,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def test_kill_the_api_mid_stream_and_resume_on_another_replica(replicas):
    first_part = b""
    last_id = None
    with httpx.stream(
        "POST", replicas.bases[0] + "/v1/chat/completions", json=BODY, headers=A, timeout=120
    ) as r:
        for chunk in r.iter_raw():
            first_part += chunk
            got = events(first_part.rsplit(b"\n\n", 1)[0] + b"\n\n")
            if len([e for e in got if e[0]]) >= 12:
                last_id = [e for e in got if e[0]][-1][0]
                first_part = first_part.rsplit(b"\n\n", 1)[0] + b"\n\n"
                replicas.apis[0].signal(signal.SIGKILL)
                break
    job_id = json.loads(events(first_part)[0][1])["id"]
    rest = replay(replicas.bases[1], job_id, A, cursor=last_id)
    combined = events(first_part) + events(rest)
    full = replay(replicas.bases[1], job_id, A)
    assert combined == events(full), "the resumed events equal an uninterrupted stream, event for event"
    parsed = check_stream(full, "chat", include_usage=True)
    assert parsed.error is None and parsed.usage["completion_tokens"] <= 80
    ids = [i for i, _ in events(full) if i]
    assert len(ids) == len(set(ids)), "ids are unique"
    replicas.restart(0)


def test_resume_after_the_job_finished_and_with_starting_after(replicas):
    with httpx.stream(
        "POST", replicas.bases[0] + "/v1/chat/completions", json=BODY, headers=A, timeout=120
    ) as r:
        original = r.read()
    evs = events(original)
    job_id = json.loads(evs[0][1])["id"]
    # incl. after the finish, and after the usage chunk (a client that missed only [DONE])
    for k in (1, len(evs) // 2, len(evs) - 3, len(evs) - 2, len(evs) - 1):
        cursor = evs[k - 1][0]
        tail = events(replay(replicas.bases[1], job_id, A, cursor=cursor))
        assert tail == evs[k:], f"after {cursor}"
        assert events(replay(replicas.bases[1], job_id, A, query=f"&starting_after={cursor}")) == evs[k:]
    assert events(replay(replicas.bases[0], job_id, A)) == evs  # full replay without a cursor


def test_bad_cursor_is_400(replicas):
    r = httpx.post(
        replicas.bases[0] + "/v1/chat/completions",
        json={**BODY, "stream": False, "background": True},
        headers=A,
    )
    assert r.status_code == 202
    job_id = r.json()["id"]
    bad = httpx.get(
        f"{replicas.bases[0]}/v1/chat/completions/{job_id}?stream=true",
        headers={**A, "Last-Event-ID": "nonsense"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_cursor"


PAST_END = "99999999999999-0"  # an event id no stream of today reaches (ms in the year 5138)


def refused_at_once(url: str, headers: dict) -> tuple[dict, float]:
    """A resume that must be refused: its error body and how long it took. The client's
    timeout is short and the status is read before any body, so a stream (today's keep-alives,
    for as long as the job is retained) fails the test at once rather than hang it."""
    started = time.monotonic()
    with httpx.stream("GET", url, headers=headers, timeout=5) as r:
        assert r.status_code == 400, (
            f"{r.status_code} {r.headers.get('content-type')}: a stream, not a refusal"
        )
        body = json.loads(r.read())
    return body, time.monotonic() - started


def next_id(entry_id: str) -> str:
    """The smallest stream id after `entry_id`."""
    ms, seq = entry_id.split("-")
    return f"{ms}-{int(seq) + 1}"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("chat/completions", BODY),
        ("completions", {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12, "stream": True}),
    ],
)
def test_a_cursor_past_an_ended_jobs_end_is_400_at_once(replicas, path, body):
    with httpx.stream("POST", f"{replicas.bases[0]}/v1/{path}", json=body, headers=A, timeout=120) as r:
        original = r.read()
    evs = events(original)
    job_id = json.loads(evs[0][1])["id"]
    finish = evs[-3][0] if body.get("stream_options") else evs[-2][0]  # the terminal entry's event
    url = f"{replicas.bases[1]}/v1/{path}/{job_id}?stream=true"
    for cursor in (PAST_END, next_id(finish)):
        for query, headers in (("", {**A, "Last-Event-ID": cursor}), (f"&starting_after={cursor}", A)):
            error, took = refused_at_once(url + query, headers)
            assert error["error"]["code"] == "invalid_cursor" and error["error"]["param"] == "starting_after"
            assert took < 2.0, f"{took:.2f}s"  # the keep-alive period is 15 s by default
    # A cursor at the terminal entry still gets the rest, as before.
    at_finish = events(replay(replicas.bases[1], job_id, A, cursor=finish, path=path))
    assert at_finish == evs[evs.index(next(e for e in evs if e[0] == finish)) + 1 :]
    assert at_finish[-1] == (None, "[DONE]")


def test_a_cursor_past_the_end_of_a_job_that_ends_meanwhile_ends_with_an_error(replicas):
    """The job runs when the resume comes (a cursor ahead of what is written may be an entry a
    replica has yet to see), so the stream waits; once the job ends, it ends at once with
    invalid_cursor and [DONE], rather than keep-alives until the job's retention ends."""
    with holding(replicas.bases[0], MODEL, A) as held:
        url = f"{replicas.bases[1]}/v1/chat/completions/{held}?stream=true"
        with httpx.stream("GET", url, headers={**A, "Last-Event-ID": PAST_END}, timeout=5) as r:
            assert r.status_code == 200
            raw, chunks = b"", r.iter_raw()
            while raw.count(b"\n\n") < 2:  # two keep-alives: it waits
                raw += next(chunks)
            httpx.post(f"{replicas.bases[0]}/v1/chat/completions/{held}/cancel", headers=A)
            cancelled = time.monotonic()
            while not raw.endswith(b"data: [DONE]\n\n"):
                assert time.monotonic() - cancelled < 5, "the stream goes on after the job ended"
                raw += next(chunks)
            took = time.monotonic() - cancelled
    blocks = [b for b in raw.decode().split("\n\n") if b]
    assert all(not b.startswith("id:") for b in blocks), "nothing of the job was sent"
    error = json.loads(blocks[-2].removeprefix("data: "))
    assert error["error"]["code"] == "invalid_cursor"
    assert took < 3.0, f"{took:.2f}s"


def test_a_background_job_with_stream_true_streams_at_once(replicas):
    r = httpx.post(replicas.bases[0] + "/v1/chat/completions", json={**BODY, "background": True}, headers=A)
    assert r.status_code == 200 and check_stream(r.content, "chat", include_usage=True).finish_reason


def test_background_job_then_fetch_and_stream(replicas):
    body = {"model": MODEL, "messages": LONG, "max_tokens": 20, "temperature": 0, "background": True}
    r = httpx.post(replicas.bases[0] + "/v1/chat/completions", json=body, headers=A)
    assert r.status_code == 202
    job = r.json()
    assert (
        job["status"] == "queued" and job["object"] == "chat.completion" and job["id"].startswith("chatcmpl-")
    )
    deadline = time.monotonic() + 60
    while True:
        got = httpx.get(f"{replicas.bases[1]}/v1/chat/completions/{job['id']}", headers=A)
        if got.status_code == 200 or time.monotonic() > deadline:
            break
        assert got.status_code == 202 and got.json()["status"] in ("queued", "in_progress")
        time.sleep(0.1)
    obj = got.json()
    assert got.status_code == 200 and obj["choices"][0]["message"]["content"]
    streamed = check_stream(replay(replicas.bases[0], job["id"], A), "chat")
    assert streamed.text == obj["choices"][0]["message"]["content"]
    # Prefer: respond-async does the same for a legacy completion
    r = httpx.post(
        replicas.bases[0] + "/v1/completions",
        json={"model": MODEL, "prompt": "Hi", "max_tokens": 3},
        headers={**A, "Prefer": "respond-async"},
    )
    assert r.status_code == 202 and r.json()["object"] == "text_completion"


def test_only_the_creating_key_can_resume_fetch_or_cancel(replicas):
    r = httpx.post(
        replicas.bases[0] + "/v1/chat/completions",
        json={"model": MODEL, "messages": LONG, "max_tokens": 5, "background": True},
        headers=A,
    )
    job_id = r.json()["id"]
    base = replicas.bases[1]
    for method, path in (
        ("GET", f"/v1/chat/completions/{job_id}?stream=true"),
        ("GET", f"/v1/chat/completions/{job_id}"),
        ("POST", f"/v1/chat/completions/{job_id}/cancel"),
    ):
        other = httpx.request(method, base + path, headers=B)
        assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
        assert httpx.request(method, base + path).status_code == 401
    assert httpx.get(f"{base}/v1/completions/{job_id}", headers=A).status_code == 404  # wrong kind
    assert httpx.get(f"{base}/v1/chat/completions/chatcmpl-doesnotexist", headers=A).status_code == 404


def test_resume_after_retention_is_404(replicas):
    r = httpx.post(
        replicas.bases[0] + "/v1/chat/completions",
        json={"model": MODEL, "messages": LONG, "max_tokens": 3},
        headers=A,
    )
    job_id = r.json()["id"]
    assert httpx.get(f"{replicas.bases[1]}/v1/chat/completions/{job_id}", headers=A).status_code == 200
    time.sleep(RETENTION + 1)
    for path in (f"/v1/chat/completions/{job_id}", f"/v1/chat/completions/{job_id}?stream=true"):
        gone = httpx.get(replicas.bases[1] + path, headers=A)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"


def test_openai_sdk_parses_ids_with_keepalives_in_between(replicas):
    # The only worker's only slot is held, so the next request waits in the queue (keep-alives)
    # until the test has counted two and lets the slot go.
    sdk = openai.OpenAI(base_url=replicas.bases[1] + "/v1", api_key=KEY_A, max_retries=0)
    with holding(replicas.bases[0], MODEL, A) as held:
        stream = sdk.chat.completions.create(model=MODEL, messages=LONG, max_tokens=10, stream=True)
        chunks = [next(stream)]
        keepalives = 0
        while keepalives < 2:
            chunks.append(next(stream))
            c = chunks[-1]
            assert c.choices and c.choices[0].delta.content is None and c.choices[0].finish_reason is None
            keepalives += 1
        httpx.post(f"{replicas.bases[0]}/v1/chat/completions/{held}/cancel", headers=A)
        chunks += list(stream)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert "".join(c.choices[0].delta.content or "" for c in chunks)


NODE_DIR = Path(__file__).resolve().parent.parent / "js"


@pytest.fixture
def keyless_api(tmp_path):
    redis_proc, url = start_redis(tmp_path)
    worker = start_worker(tmp_path, url)
    port = free_port()
    env = {"KEEPALIVE_SECONDS": "0.3", "CANCEL_GRACE_SECONDS": "1.5"}
    api, base = start_api(tmp_path, url, port=port, env=env)
    state = {"api": api}

    def restart() -> None:
        state["api"].signal(signal.SIGKILL)
        state["api"].popen.wait()
        state["api"], _ = start_api(tmp_path, url, port=port, env=env)

    try:
        wait_for_model(base, MODEL, procs=(worker, api))
        yield base, restart
    finally:
        for p in (state["api"], worker, redis_proc):
            p.stop()


def test_eventsource_reconnects_after_a_dropped_connection_and_follows_to_the_end(keyless_api):
    if not (NODE_DIR / "node_modules" / "eventsource").exists() or not shutil.which("node"):
        if os.environ.get("TOKENSPOOL_REQUIRE_NODE") == "1":
            pytest.fail("node and tests/js/node_modules are required (scripts/setup installs them)")
        pytest.skip(missing("node or the eventsource package (scripts/setup installs it with npm)"))
    base, restart = keyless_api
    # Generating until cancelled: still running when the connection drops, however fast the model.
    body = holding_body(MODEL, temperature=0, background=True)
    job_id = httpx.post(base + "/v1/chat/completions", json=body).json()["id"]
    node = subprocess.Popen(
        ["node", "follow.mjs", f"{base}/v1/chat/completions/{job_id}?stream=true", "90000"],
        cwd=NODE_DIR,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines, dropped, cancelled = [], 0, False
    for line in node.stdout:
        lines.append(json.loads(line))
        seen = len([m for m in lines if "data" in m])
        if seen == 8:
            restart()  # the connection drops; the API comes back on the same address
            dropped = seen
        if dropped and not cancelled and any("error" in m for m in lines) and seen >= dropped + 8:
            httpx.post(f"{base}/v1/chat/completions/{job_id}/cancel")  # reconnected and following: end it
            cancelled = True
    assert node.wait(timeout=30) == 0, lines
    assert any("error" in m for m in lines), "the client saw the drop and reconnected"
    messages = [m for m in lines if "data" in m]
    keepalive = '"delta":{},"logprobs":null,"finish_reason":null'
    got = [(m["id"], m["data"]) for m in messages if keepalive not in m["data"]]
    full = events(httpx.get(f"{base}/v1/chat/completions/{job_id}?stream=true", timeout=60).read())
    assert [d for _, d in got] == [d for _, d in full], "no event lost or repeated across the reconnect"
    assert [i for i, _ in got[:-1]] == [i for i, _ in full[:-1]]


def test_a_client_that_comes_back_within_the_grace_keeps_its_job(keyless_api):
    base, _ = keyless_api
    body = {
        "model": MODEL,
        "messages": LONG,
        "max_tokens": 150,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    raw = b""
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=60) as r:
        for chunk in r.iter_raw():
            raw += chunk
            if raw.count(b"\nid: ") + raw.startswith(b"id: ") >= 5 and raw.endswith(b"\n\n"):
                break  # disconnect: the job would be cancelled 1.5 s from now
    first = events(raw)
    job_id = json.loads(first[0][1])["id"]
    rest = replay(base, job_id, {}, cursor=first[-1][0])  # back within the grace
    parsed = check_stream(raw + rest, "chat", include_usage=True)
    assert parsed.finish_reason == "length" and parsed.usage["completion_tokens"] == 150
