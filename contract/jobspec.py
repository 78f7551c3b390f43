"""What the API enqueues for a worker: one completion request, already validated.

The API turns an OpenAI request into a `JobSpec` (content parts joined, defaults applied)
and enqueues `JobSpec.to_dict()` as the single JSON argument of `keys.JOB_FUNCTION`. The
worker rebuilds it with `JobSpec.from_dict`, which checks every field again: a job planted
in Redis by someone else must not reach the model with arguments the API would refuse.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field

ROLES = ("system", "user", "assistant")
KINDS = ("chat", "text")


class InvalidSpec(ValueError):
    """The job arguments do not describe a valid completion."""


def digest(spec: dict) -> str:
    """A spec's fingerprint, the same for the dict the API recorded and the one a worker took
    from RQ: a worker claims a job only for the spec the API recorded for it."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class JobSpec:
    id: str
    kind: str  # "chat" (messages) or "text" (prompt)
    model: str
    messages: tuple[Message, ...] = ()
    prompt: str = ""
    max_tokens: int | None = None  # None: until the context is full
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def to_dict(self) -> dict:
        data = asdict(self)
        data["messages"] = [asdict(m) for m in self.messages]
        data["stop"] = list(self.stop)
        return data

    @classmethod
    def from_dict(cls, data: object) -> JobSpec:
        if not isinstance(data, dict):
            raise InvalidSpec("job arguments must be an object")
        known = set(cls.__dataclass_fields__)
        extra = set(data) - known
        if extra:
            raise InvalidSpec(f"unknown job fields: {sorted(extra)}")
        try:
            messages = tuple(Message(role=m["role"], content=m["content"]) for m in data.get("messages", ()))
            spec = cls(
                id=data["id"],
                kind=data["kind"],
                model=data["model"],
                messages=messages,
                prompt=data.get("prompt", ""),
                max_tokens=data.get("max_tokens"),
                temperature=data.get("temperature", 1.0),
                top_p=data.get("top_p", 1.0),
                stop=tuple(data.get("stop", ())),
                seed=data.get("seed"),
                presence_penalty=data.get("presence_penalty", 0.0),
                frequency_penalty=data.get("frequency_penalty", 0.0),
            )
        except (KeyError, TypeError) as exc:
            raise InvalidSpec(f"malformed job arguments: {exc!r}") from None
        spec.check()
        return spec

    def check(self) -> None:
        """Raise InvalidSpec unless every field is of the right type and range."""

        def number(name: str, lo: float, hi: float) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidSpec(f"{name} must be a number")
            if not math.isfinite(value) or not lo <= value <= hi:
                raise InvalidSpec(f"{name} must be between {lo} and {hi}")

        for name in ("id", "model", "prompt"):
            if not isinstance(getattr(self, name), str):
                raise InvalidSpec(f"{name} must be a string")
        if not self.id or not self.model:
            raise InvalidSpec("id and model must not be empty")
        if self.kind not in KINDS:
            raise InvalidSpec(f"kind must be one of {KINDS}")
        if self.kind == "chat" and not self.messages:
            raise InvalidSpec("a chat job needs messages")
        for m in self.messages:
            if m.role not in ROLES or not isinstance(m.content, str):
                raise InvalidSpec("each message needs a known role and string content")
        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1
        ):
            raise InvalidSpec("max_tokens must be a positive integer")
        number("temperature", 0.0, 2.0)
        number("top_p", 0.0, 1.0)
        number("presence_penalty", -2.0, 2.0)
        number("frequency_penalty", -2.0, 2.0)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidSpec("seed must be an integer")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidSpec("stop strings must be non-empty strings")
