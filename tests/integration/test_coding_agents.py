"""Claude Code, Codex CLI and opencode, the real CLIs from npm (tests/js/agents/package.json), each
running one turn against real processes in its default configuration (tests/agents.py), and
again while the worker answering it is SIGKILLed mid-answer.

Their default requests are large (Claude Code's about 18k tokens of system prompt and tools,
Codex's about 3k, opencode's about 8k) and the default model reads 4,096 (SmolLM2-135M: 8,192
at most), so the turns run on the synthetic engine (worker/engine/synthetic.py) with a 64k
context: each CLI's whole default request goes through the API, the queue, a worker's
runner and publisher and the stream relay unchanged, and its deterministic answer (" w0 w1
... w39") shows whether the CLI printed all of it, once. What the default model does with
a request larger than its context is the last test. A third worker serves a model whose jobs
call the shell tool a CLI offers once a user turn (`SYNTHETIC_TOOL_CALLS`): each CLI runs the
tool and sends its result back, and the answer after it is printed."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from contract import entries, keys
from devstack.peek import job_ids, running_ids
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from tests import agents
from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration

AGENT_MODEL = "synthetic-agent"
TOOL_MODEL = "synthetic-agent-tools"  # its jobs call the shell tool first
WORDS = 40
ANSWER = " ".join(f"w{n}" for n in range(WORDS))
HEADERS = {"x-api-key": agents.KEY}
WHOLE = (
    1000  # prompt tokens above which a job carries a CLI's whole default prompt (opencode's title has ~400)
)


@dataclass
class Pool:
    base: str
    r: redis.Redis
    logs: Path
    url: str
    workers: dict[str, Proc]

    def replace(self, name: str) -> None:
        """A killed worker's place taken by a new one, so that the next test has two."""
        self.workers[name] = start_worker(self.logs, self.url, name=f"{name}-again", env=SYNTHETIC)
        wait_for_model(self.base, AGENT_MODEL, procs=(self.workers[name],), headers=HEADERS)


SYNTHETIC = {
    "ENGINE": "synthetic",
    "MODEL_NAME": AGENT_MODEL,
    "N_CTX": "65536",  # the CLIs' default prompts, whole
    "SYNTHETIC_TOKENS": str(WORDS),
    "SYNTHETIC_RATE": "20",  # 2 s an answer: long enough to kill a worker in the middle
    "HEARTBEAT_WINDOW_SECONDS": "2",
}


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[Pool]:
    """Two synthetic workers (a killed one's job goes on on the other) behind an API with keys."""
    logs = tmp_path_factory.mktemp("agents")
    redis_proc, url = start_redis(logs)
    api, base = start_api(
        logs, url, env={"API_KEYS": agents.KEY, "KEEPALIVE_SECONDS": "0.5", "REAPER_INTERVAL_SECONDS": "0.2"}
    )
    workers = {name: start_worker(logs, url, name=name, env=SYNTHETIC) for name in ("a1", "a2")}
    tools = {**SYNTHETIC, "MODEL_NAME": TOOL_MODEL, "SYNTHETIC_TOOL_CALLS": "1", "SYNTHETIC_RATE": "0"}
    workers["t1"] = start_worker(logs, url, name="t1", env=tools)
    pool = Pool(base, redis.Redis.from_url(url), logs, url, workers)
    try:
        wait_for_model(base, AGENT_MODEL, procs=(api, *workers.values()), headers=HEADERS)
        wait_for_model(base, TOOL_MODEL, procs=(api, *workers.values()), headers=HEADERS)
        yield pool
    finally:
        for p in (*pool.workers.values(), api, redis_proc):
            p.stop()


@dataclass(frozen=True)
class Job:
    prompt_tokens: int  # as the worker counted them (the synthetic engine: words, and 4 a message)
    text: str
    end: entries.Entry | None
    attempts: int  # workers that started it


def jobs(r: redis.Redis, ids: set[str]) -> dict[str, Job]:
    """What the stack's workers made of each job: its prompt's size, its text, its end."""
    out = {}
    for job_id in ids:
        rows = [entries.decode(f) for _, f in r.xrange(keys.events(job_id))]
        started = [e.prompt_tokens for e in rows if isinstance(e, entries.Started)]
        text = "".join(e.text for e in rows if isinstance(e, entries.Delta))
        out[job_id] = Job(max(started, default=0), text, rows[-1] if rows else None, len(started))
    return out


def answered(pool: Pool, before: set[str]) -> dict[str, Job]:
    """The jobs made since `before`, each of which must have ended well."""
    made = jobs(pool.r, job_ids(pool.r) - before)
    assert made, "the CLI sent the stack nothing"
    for job in made.values():
        assert isinstance(job.end, entries.Finished) and job.end.finish_reason == "stop", job.end
        assert job.text == " " + ANSWER
    return made


@pytest.mark.parametrize("agent", agents.AGENTS)
def test_a_turn_in_the_default_configuration_prints_the_whole_answer(pool, agent, tmp_path):
    before = job_ids(pool.r)
    done = agents.run(agents.turn(agent, pool.base, AGENT_MODEL, tmp_path, "Say hi."))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(ANSWER) == 1, done.stdout
    made = answered(pool, before)
    # the whole default prompt reached the worker: thousands of words, not a trimmed one
    assert max(j.prompt_tokens for j in made.values()) > WHOLE, made


@pytest.mark.parametrize("agent", agents.AGENTS)
def test_a_worker_killed_mid_answer_leaves_the_turn_complete(pool, agent, tmp_path):
    """SIGKILL the worker holding the turn's main job (its largest prompt: opencode also asks
    a title beside it) once it has streamed some words: another worker goes on from them."""
    before = job_ids(pool.r)
    cli = agents.start(agents.turn(agent, pool.base, AGENT_MODEL, tmp_path, "Say hi."))
    try:
        victim = _holder_mid_answer(pool, before, cli)
        pool.workers[victim].signal(signal.SIGKILL)
        out, err = cli.communicate(timeout=120)
    finally:
        cli.kill()
    assert cli.returncode == 0, out + err
    assert out.count(ANSWER) == 1, out
    made = answered(pool, before)
    assert max(made.values(), key=lambda j: j.prompt_tokens).attempts == 2
    pool.replace(victim)


@pytest.mark.parametrize("agent", agents.AGENTS)
def test_a_tool_round_trip_runs_the_tool_and_prints_the_answer_after_it(pool, agent, tmp_path):
    """The model calls the CLI's own shell tool (its name and schema as the CLI sent them), the
    CLI runs it in its project folder and sends the result back, and prints the answer."""
    before = job_ids(pool.r)
    t = agents.turn(agent, pool.base, TOOL_MODEL, tmp_path, "Write the file.", tools=True)
    done = agents.run(t)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (t.cwd / "tool-ran.txt").read_text().strip() == "tokenspool-tool-ran", done.stdout
    assert done.stdout.count(ANSWER) == 1, done.stdout
    made = jobs(pool.r, job_ids(pool.r) - before)
    ends = [j.end.finish_reason for j in made.values() if isinstance(j.end, entries.Finished)]
    assert ends.count("tool_calls") == 1 and "stop" in ends, made
    called = next(j for j in made.values() if j.end.finish_reason == "tool_calls")
    assert called.prompt_tokens > WHOLE  # the CLI's whole default request, its tools included


def _holder_mid_answer(pool: Pool, before: set[str], cli) -> str:
    """The name of the worker running the turn's main job once 5 of its words are out."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and cli.poll() is None:
        running = set(running_ids(pool.r)) - before
        made = {i: j for i, j in jobs(pool.r, running).items() if j.prompt_tokens > WHOLE}
        if made:
            main, job = max(made.items(), key=lambda kv: kv[1].prompt_tokens)
            if len(job.text.split()) >= 5:
                holder = pool.r.hget(keys.job(main), keys.JobField.WORKER)
                if holder:
                    return next(n for n, p in pool.workers.items() if p.name == holder.decode())
        time.sleep(0.05)
    raise AssertionError(f"no job of the turn was seen mid-answer (the CLI ended: {cli.poll()})")


def test_opencodes_default_prompt_is_longer_than_the_default_model_reads(tmp_path):
    """opencode's default request (about 8k tokens) on SmolLM2 with N_CTX 4096: the worker's
    OpenAI-style `context_length_exceeded` comes in the stream (headers are sent before a worker
    takes the job), and opencode prints its message and exits 1."""
    redis_proc, url = start_redis(tmp_path)
    api, base = start_api(tmp_path, url, env={"API_KEYS": agents.KEY})
    worker = start_worker(tmp_path, url, env={"SLOTS": "2"})
    try:
        wait_for_model(base, MODEL, procs=(api, worker), headers=HEADERS)
        done = agents.run(agents.turn("opencode", base, MODEL, tmp_path, "Say hi."))
    finally:
        for p in (worker, api, redis_proc):
            p.stop()
    assert done.returncode == 1, done.stdout + done.stderr
    shown = done.stdout + done.stderr
    assert "context_length_exceeded" in shown and "maximum context length is 4096 tokens" in shown, shown


def test_a_claude_code_session_s_next_turn_reads_only_its_new_tokens(tmp_path):
    """Claude Code trimmed by its own flags (`--bare`, a short system prompt, no tools) on the
    default model, one slot: the session's next turn (`--resume`) finds its first turn, prompt
    and most of the answer (re-tokenized, the answer's text may split otherwise), in the slot's
    cache, and reads only the rest. The tiny model samples (Claude Code sends no temperature)
    and may overrun CLAUDE_CODE_MAX_OUTPUT_TOKENS, which Claude Code then reports as an error
    after asking for more: the turn's exit status is not the point here, its requests are."""
    redis_proc, url = start_redis(tmp_path)
    api, base = start_api(tmp_path, url, env={"API_KEYS": agents.KEY})
    worker = start_worker(tmp_path, url, env={"SLOTS": "1"})
    r = redis.Redis.from_url(url)
    session = str(uuid.uuid4())
    trimmed = ["--bare", "--system-prompt", "You are a terse assistant.", "--tools", ""]
    turns = []
    try:
        wait_for_model(base, MODEL, procs=(api, worker), headers=HEADERS)
        for flags, prompt in ((["--session-id", session], "Say hi."), (["--resume", session], "Say bye.")):
            before = job_ids(r)
            t = agents.turn("claude", base, MODEL, tmp_path, prompt, flags=[*trimmed, *flags])
            t.env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = "64"  # a bound on each answer's time
            done = agents.run(t, timeout=240)
            made = jobs(r, job_ids(r) - before)
            assert made, done.stdout + done.stderr
            turns.append(min(made.values(), key=lambda j: j.prompt_tokens))  # the turn's own request
    finally:
        for p in (worker, api, redis_proc):
            p.stop()
    first, second = turns
    assert isinstance(second.end, entries.Finished)
    assert second.end.cached_tokens >= first.prompt_tokens, (first, second)
    assert second.prompt_tokens - second.end.cached_tokens < first.prompt_tokens
