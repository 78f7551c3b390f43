"""A model-free engine for load tests of the API and Redis tiers (capacity planning).

It emits a fixed number of tokens per job at a fixed rate. It goes through exactly the same
job runner, publisher and stream contract as the real engine. Only the token source differs.
Tokens are deterministic: the n-th token of every completion is " w<n>". So a resumed job
continues exactly where it stopped, and tests can check the text.

With `SYNTHETIC_TOOL_CALLS=1`, a job offered a shell tool first calls it, once per user turn.
The shell tool may be a coding agent's `Bash`, `shell` or `exec_command`. The call holds
`SCRIPTED_COMMAND` in Hermes tags. The job after the tool's result answers with the words. So
an agent's whole tool round trip runs through the real worker, queue and API. It does so on
any request size, deterministically.

It cannot be enabled by accident. It needs `ENGINE=synthetic`. It serves only model names
that start with `synthetic`. So it never takes a real model's jobs. And it says so loudly in
the log at start and on every job.

`ScriptedEngine` answers each job with a script of token ids, and records what it was asked.
The worker's attempts are tested on it, as httpx's MockTransport stands in for a network.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Callable, Generator

from contract.jobspec import JobSpec
from contract.stats import BatchCounters
from worker.engine.protocol import Generation
from worker.engine.steps.picks import Pick
from worker.errors import PromptTooLong
from worker.text.replies import PlainReply, Reply
from worker.text.thinking import Thinking
from worker.tools import clearing
from worker.tools.hermes import HermesTools

log = logging.getLogger(__name__)

NAME_PREFIX = "synthetic"
EOS = 0
_FIRST_WORD_ID = 1_000
# a sleep per token would cost more than the token at thousands/s
_MIN_SLEEP_S = 0.001
# a scripted call's characters: this plus the code point
_FIRST_CHAR_ID = 2_000_000
SCRIPTED_COMMAND = "echo tokenspool-tool-ran > tool-ran.txt"
# tool names, lowercased
SHELLS = ("bash", "shell", "exec_command", "shell_command", "run_command")


# no memory to size it by (worker/engine/sizing.py): load tests set SLOTS
DEFAULT_SLOTS = 8


class ModelFree:
    """What an engine without a model says of itself: no device, no cache, nothing to warm."""

    placement = None
    held = None
    # no template: the API reserves its most for one
    prompt_overhead = None

    def close_thinking(self, spec: JobSpec) -> list[int]:
        return []

    def warm_up(self, budget_s: float = 30.0, until: Callable[[], bool] = lambda: False) -> float:
        return 0.0

    def step_ms(self) -> float:
        return 0.0

    def counters(self) -> BatchCounters:
        return BatchCounters()


class SyntheticEngine(ModelFree):
    def __init__(
        self,
        model_name: str,
        n_ctx: int,
        tokens_per_job: int,
        rate: float,
        slots: int | None = None,
        load_s: float = 0.0,
        tool_calls: bool = False,
    ) -> None:
        if not model_name.startswith(NAME_PREFIX):
            raise SystemExit(
                f"ENGINE=synthetic serves only model names starting with {NAME_PREFIX!r} "
                f"(got MODEL_NAME={model_name!r}), so it can never answer a real model's requests."
            )
        self.model_name = model_name
        self.n_ctx = n_ctx
        self.slots = slots or DEFAULT_SLOTS
        self.tokens_per_job = tokens_per_job
        # tokens per second per job; 0 = as fast as the publish path allows
        self.rate = rate
        # a shell tool offered is called once a user turn
        self.tool_calls = tool_calls
        log.warning(
            "SYNTHETIC ENGINE: model %r answers with %d generated words per job at %s tok/s, "
            "no model is loaded. For load tests only.",
            model_name,
            tokens_per_job,
            rate or "unlimited",
        )
        # a model's load, for tests of what happens while a worker starts
        time.sleep(load_s)

    def edited(self, spec: JobSpec) -> tuple[JobSpec, tuple[int, int]]:
        """Its clear_tool_uses edit applied (worker/tools/clearing.py), words counted as tokens."""
        if spec.kind != "chat" or spec.clear_tool_uses is None:
            return spec, (0, 0)
        before = len(self._ids(spec))
        edited, uses = clearing.clear_tool_uses(spec, before, lambda text: len(_word_ids(text)))
        return edited, (uses, before - len(self._ids(edited)) if uses else 0)

    def _ids(self, spec: JobSpec) -> list[int]:
        """One id per whitespace-separated word (4 more per chat message for its markers)."""
        if spec.kind != "chat":
            return _word_ids(spec.prompt)
        return [i for m in spec.messages for i in (1, 2, 3, 4, *_word_ids(m.content))]

    def prompt_ids(self, spec: JobSpec) -> list[int]:
        ids = self._ids(spec)
        if len(ids) >= self.n_ctx:
            raise PromptTooLong(len(ids), self.n_ctx, "messages" if spec.kind == "chat" else "prompt")
        return ids

    def is_end(self, token: int) -> bool:
        return token == EOS

    def reply(self, spec: JobSpec, prompt: list[int]) -> Reply:
        return HermesTools().reply(spec) if self._call(spec) else PlainReply()

    def piece(self, token: int) -> bytes:
        if token >= _FIRST_CHAR_ID:
            return chr(token - _FIRST_CHAR_ID).encode()
        return f" w{token - _FIRST_WORD_ID}".encode() if token >= _FIRST_WORD_ID else b""

    def _call(self, spec: JobSpec) -> str | None:
        """The scripted call's text, if this job makes one.

        A job makes one when it is offered a shell tool. Its conversation's last user turn must
        also have had no tool result yet."""
        if not (self.tool_calls and spec.uses_tools and spec.kind == "chat"):
            return None
        last_user = max((i for i, m in enumerate(spec.messages) if m.role == "user"), default=-1)
        if any(m.role == "tool" for m in spec.messages[last_user + 1 :]):
            return None
        shell = next((t for t in spec.tools if t.freeform is None and t.name.lower() in SHELLS), None)
        if shell is None:
            return None
        arguments = _arguments(shell.parameters)
        return f"<tool_call>{json.dumps({'name': shell.name, 'arguments': arguments})}</tool_call>"

    def tokens(self, job: Generation) -> Generator[tuple[Pick, bytes]]:
        """Words after those earlier attempts generated, then EOS.

        A resumed job goes on where it stopped. Words are paced from the first one on an
        absolute schedule. With `ignore_eos`, words go on until the caller stops at
        max_tokens."""
        spec, prompt = job.spec, job.prompt
        log.warning("SYNTHETIC ENGINE answering %s", spec.id)
        position = len(job.prior)
        # a resumed call goes on from its character
        if (call := self._call(spec)) is not None:
            for ch in call[position:]:
                yield Pick(_FIRST_CHAR_ID + ord(ch)), ch.encode()
            yield Pick(EOS), b""
            return
        # no end: until max_tokens
        wanted = self.n_ctx if spec.ignore_eos else self.tokens_per_job
        # the window's end
        last = min(wanted, self.n_ctx - len(prompt))
        start = time.monotonic()
        for n, pos in enumerate(range(position, last)):
            if self.rate > 0:
                delay = start + n / self.rate - time.monotonic()
                # at high rates, tokens come in bursts of ~1 ms
                if delay > _MIN_SLEEP_S:
                    time.sleep(delay)
            yield Pick(_FIRST_WORD_ID + pos), f" w{pos}".encode()
        if last == wanted and not spec.ignore_eos:
            yield Pick(EOS), b""


class ScriptedEngine(ModelFree):
    """An engine that says its script: the same token ids for every job, then nothing more.

    Each `Generation` it is asked for is kept in `asked`. `on_token(i)` runs before the i-th
    token. When the caller closes the tokens, `cached` is told `cached_tokens`. A token's text
    is `words[token]`, else `<token>`. With `opened` set, its reply reads thinking (True: the
    prompt opened the block)."""

    PROMPT = (100, 101, 102)

    def __init__(
        self,
        script: list[int],
        on_token: Callable[[int], None] | None = None,
        cached_tokens: int = 0,
        words: dict[int, str] | None = None,
        opened: bool | None = None,
        model_name: str = "m",
        n_ctx: int = 64,
    ) -> None:
        self.script = script
        self.on_token = on_token
        self.cached_tokens = cached_tokens
        self.words = words or {}
        self.opened = opened
        self.model_name, self.n_ctx, self.slots = model_name, n_ctx, 1
        self.asked: list[Generation] = []

    @property
    def contexts(self) -> list[list[int]]:
        """What each generation read: its prompt, then what earlier attempts generated."""
        return [[*job.prompt, *job.prior] for job in self.asked]

    def edited(self, spec: JobSpec) -> tuple[JobSpec, tuple[int, int]]:
        return spec, (0, 0)

    def prompt_ids(self, spec: JobSpec) -> list[int]:
        return list(self.PROMPT)

    def is_end(self, token: int) -> bool:
        return token == EOS

    def piece(self, token: int) -> bytes:
        return self.words.get(token, f"<{token}>").encode()

    def reply(self, spec: JobSpec, prompt: list[int]) -> Reply:
        return PlainReply() if self.opened is None else Thinking(PlainReply(), self.opened)

    def tokens(self, job: Generation) -> Generator[tuple[Pick, bytes]]:
        self.asked.append(job)
        try:
            for i, token in enumerate(self.script):
                if self.on_token:
                    self.on_token(i)
                yield Pick(token), self.piece(token)
        finally:
            if job.cached is not None:
                job.cached(self.cached_tokens)


def _arguments(schema: dict) -> dict:
    """Arguments a shell tool's schema takes.

    The command goes where the schema names one. It is a string, or an argv as Codex's `shell`
    takes it. Its other required properties get plain values."""
    properties = schema.get("properties", {})
    out: dict = {}
    for name, prop in properties.items():
        kind = prop.get("type", "string")
        if name in ("command", "cmd"):
            out[name] = ["bash", "-lc", SCRIPTED_COMMAND] if kind == "array" else SCRIPTED_COMMAND
        elif name in schema.get("required", ()):
            plain = {"string": "Writes a file", "integer": 10_000, "number": 10_000, "boolean": False}
            out[name] = plain.get(kind, [] if kind == "array" else {})
    return out


def _word_ids(text: str) -> list[int]:
    return [_FIRST_WORD_ID + zlib.crc32(w.encode()) % 50_000 for w in text.split()]
