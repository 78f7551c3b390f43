"""The format of one entry of a job's event stream.

A job's stream holds, in order: one `Started` per attempt, then `Delta`s, then exactly one
terminal entry, `Finished` or `Failed`. A `Delta` carries generated text with the exact token
ids that produced it. Every entry records the attempt epoch that wrote it. Redis stores a
stream's repeated field names only once. So field names are short and identical across entries.

Entries are built by keyword. `epoch` is 0 until whoever writes the entry stamps it. An attempt
writes its own epoch (APPEND refuses 0). The END script stamps the next one.

A job stopped by a cancel ends with `Finished` whose reason is "cancelled". The job's status
becomes cancelled. Each API endpoint says it its own way (chat: finish_reason "stop").

Invariant for deltas: a delta's token ids are exactly the tokens generated since the last delta.
So a new attempt continues from `prompt + ids` without re-tokenizing text. Its `text` is the
content the client sees of those tokens. It is their UTF-8 decoding, never a partial character.
Only the last delta before the terminal entry may hold less text than its ids. What follows a
stop string is not sent, nor a character cut off by max_tokens. A job with tools reads its
tokens' text as content and tool-call fragments (worker/text/replies.py). Its `text` is then the
content only, and `calls` the fragments. A reasoning model's thinking is apart from both, in
`reasoning` (worker/text/thinking.py). Its tokens are counted in the terminal entry. `logprobs`
has one entry per token id, when the job asked for them.

An embed job writes no deltas. Its `Finished` carries every vector (`vectors`), and its inputs'
tokens as `prompt_tokens`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass

KIND = "k"
EPOCH = "e"


@dataclass(frozen=True)
class CallPart:
    """A fragment of tool call `index`.

    Its first fragment carries the id and the name. The others carry pieces of its arguments'
    JSON text."""

    index: int
    arguments: str = ""
    id: str = ""
    name: str = ""


def join_calls(calls: list[CallPart], parts: Iterable[CallPart]) -> None:
    """Join streamed fragments into whole calls, in place.

    A fragment without an id goes on with the last call when it has that call's index. Any
    other fragment starts a call. The one rule for the API's answers and the worker's replies."""
    for part in parts:
        last = calls[-1] if calls else None
        if last is not None and last.index == part.index and not part.id:
            calls[-1] = CallPart(last.index, last.arguments + part.arguments, last.id, last.name)
        else:
            calls.append(part)


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's bytes and log-probability, and the most likely tokens' (`top`)."""

    piece: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...] = ()


@dataclass(frozen=True, kw_only=True)
class Started:
    """An attempt began on a worker, going on from the entry `after`.

    `after` is the id of the stream's last entry when the attempt read what earlier attempts
    wrote. It is "0-0" for none, and "" from a worker that did not say. A reader that sent
    entries past `after` knows a failover took them back (docs/protocol.md, "Failover")."""

    epoch: int = 0
    worker: str
    prompt_tokens: int
    after: str = ""
    # what the job's clear_tool_uses edit cleared (contract/edits/tool_uses.py): the same on every
    # attempt, since the worker clears the same tool uses of the same prompt
    cleared_tool_uses: int = 0
    cleared_input_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class Delta:
    """Generated text, with the token ids it decodes from."""

    epoch: int = 0
    text: str
    token_ids: tuple[int, ...]
    calls: tuple[CallPart, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    # thinking, before `text` in the output
    reasoning: str = ""


@dataclass(frozen=True, kw_only=True)
class Finished:
    """Terminal: generation ended normally, or was cancelled."""

    epoch: int = 0
    # one of FINISH_REASONS
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    # of the prompt's, those the slot's cache held (the attempt that ended)
    cached_tokens: int = 0
    # of the completion's, those of its thinking
    reasoning_tokens: int = 0
    # the stop string that ended it ("stop"), if one did
    stop_sequence: str = ""
    # an embed job's vectors: float32, little-endian, one after another in its inputs' order
    vectors: bytes = b""
    # floats per vector
    dimensions: int = 0


@dataclass(frozen=True, kw_only=True)
class Failed:
    """Terminal: the job cannot produce (more) output.

    It holds an OpenAI error object, built from the catalogue in `contract.errors`."""

    epoch: int = 0
    message: str
    type: str
    code: str
    param: str | None = None


Entry = Started | Delta | Finished | Failed
# a stream's entries with their ids, as read
Rows = list[tuple[str, Entry]]
TERMINAL = (Finished, Failed)

STOP, LENGTH, CANCELLED, TOOL_CALLS = "stop", "length", "cancelled", "tool_calls"
FINISH_REASONS = (STOP, LENGTH, CANCELLED, TOOL_CALLS)


def encode(entry: Entry) -> dict[str, str]:
    """Entry -> stream fields (all strings), including the epoch."""
    if isinstance(entry, Delta):
        fields = {
            KIND: "d",
            EPOCH: str(entry.epoch),
            "t": entry.text,
            "i": ",".join(map(str, entry.token_ids)),
        }
        if entry.reasoning:
            fields["z"] = entry.reasoning
        if entry.calls:
            fields["u"] = _compact([[c.index, c.id, c.name, c.arguments] for c in entry.calls])
        if entry.logprobs:
            fields["l"] = _compact(
                [[lp.piece.hex(), lp.logprob, [[b.hex(), v] for b, v in lp.top]] for lp in entry.logprobs]
            )
        return fields
    if isinstance(entry, Started):
        fields = {
            KIND: "s",
            EPOCH: str(entry.epoch),
            "w": entry.worker,
            "p": str(entry.prompt_tokens),
        }
        if entry.after:
            fields["a"] = entry.after
        # absent unless set: an earlier API reads the entry
        if entry.cleared_tool_uses:
            fields["g"] = f"{entry.cleared_tool_uses},{entry.cleared_input_tokens}"
        return fields
    if isinstance(entry, Finished):
        if entry.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}")
        fields = {
            KIND: "f",
            EPOCH: str(entry.epoch),
            "r": entry.finish_reason,
            "p": str(entry.prompt_tokens),
            "c": str(entry.completion_tokens),
        }
        if entry.cached_tokens:
            fields["h"] = str(entry.cached_tokens)
        if entry.reasoning_tokens:
            fields["n"] = str(entry.reasoning_tokens)
        if entry.stop_sequence:
            fields["q"] = entry.stop_sequence
        if entry.vectors:
            fields["v"] = base64.b64encode(entry.vectors).decode()
            fields["o"] = str(entry.dimensions)
        return fields
    if isinstance(entry, Failed):
        fields = {
            KIND: "x",
            EPOCH: str(entry.epoch),
            "m": entry.message,
            "y": entry.type,
            "c": entry.code,
        }
        if entry.param is not None:
            fields["a"] = entry.param
        return fields
    raise TypeError(f"not a stream entry: {entry!r}")


def as_text(value: str | bytes) -> str:
    """A Redis reply (bytes, as redis-py returns them without decode_responses) as a string."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def decode(raw: dict, token_ids: bool = True) -> Entry:
    """Stream fields (str or bytes keys/values, as redis-py returns them) -> entry.

    With `token_ids=False` a delta's ids are not parsed but left empty. The API relays text
    only."""
    f = {as_text(k): as_text(v) for k, v in raw.items()}
    kind = f.get(KIND)
    epoch = int(f[EPOCH])
    if kind == "d":
        ids = tuple(int(x) for x in f["i"].split(",")) if f["i"] and token_ids else ()
        calls = tuple(CallPart(i, a, c, n) for i, c, n, a in json.loads(f["u"])) if "u" in f else ()
        logprobs = (
            tuple(
                TokenLogprob(bytes.fromhex(p), v, tuple((bytes.fromhex(b), w) for b, w in top))
                for p, v, top in json.loads(f["l"])
            )
            if "l" in f
            else ()
        )
        return Delta(
            epoch=epoch, text=f["t"], token_ids=ids, calls=calls, logprobs=logprobs, reasoning=f.get("z", "")
        )
    if kind == "s":
        uses, tokens = (int(x) for x in f.get("g", "0,0").split(","))
        return Started(
            epoch=epoch,
            worker=f["w"],
            prompt_tokens=int(f["p"]),
            after=f.get("a", ""),
            cleared_tool_uses=uses,
            cleared_input_tokens=tokens,
        )
    if kind == "f":
        return Finished(
            epoch=epoch,
            finish_reason=f["r"],
            prompt_tokens=int(f["p"]),
            completion_tokens=int(f["c"]),
            cached_tokens=int(f.get("h", 0)),
            reasoning_tokens=int(f.get("n", 0)),
            stop_sequence=f.get("q", ""),
            vectors=base64.b64decode(f["v"]) if "v" in f else b"",
            dimensions=int(f.get("o", 0)),
        )
    if kind == "x":
        return Failed(epoch=epoch, message=f["m"], type=f["y"], code=f["c"], param=f.get("a"))
    raise ValueError(f"unknown stream entry kind: {kind!r}")


def _compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def is_terminal(entry: Entry) -> bool:
    return isinstance(entry, TERMINAL)
