"""Digests of a prompt's prefixes, the same on both sides.

They say what a worker's KV cache holds, and what a new job's prompt starts with. Cache-aware
routing compares them (api/jobs/routing.py, worker/engine/held.py).

The API has no tokenizer. So the prefixes are not token blocks but the prompt's own parts. For
a chat job, they are each message boundary (the first k messages, k = 1..n). They are chained,
so a digest stands for everything before it. For a legacy completion, they are each
256-character block of the prompt. A worker whose slot ran a job holds that job's prefixes. For
a chat job answered with text alone, it holds one more prefix. That is the conversation with
that answer as the assistant's next message: what the next turn starts with. A digest is 16 hex
digits of BLAKE2b. It covers the model, the job's tools and template kwargs, its cache scope and
the parts. The tools and template kwargs are what the prompt is rendered with beside its
messages. A message with images covers their hashes too. So a turn about another screenshot is
another prefix.

A cache is a side channel. A job that reuses one is answered sooner, and told how many tokens it
reused. A key that could hit another key's cache could thus test guesses of its prompts. So each
job has a cache scope (`cache_scope`). It is the key that sent it, or a salt that keys share on
purpose. A worker reuses a slot's cache only for a job of the scope that filled it. Routing
digests differ by scope too (docs/security.md, "Tenancy"). One exception, the operator's to
make: a system prompt made public (PUBLIC_PROMPTS_FILE). A job whose first message is one
(`public_prompt`) shares that message's digest with every scope. That digest is of the model,
the kind and the message alone. The job also shares a slot's cache of that message's tokens as
it renders alone (worker/engine/prompts.py `public_tokens`). Everything else is the scope's own.
The digests after the public prompt chain the scope, the tools and the template kwargs. So a key
cannot test guesses of the tools another key sends with a public prompt.

The API must know one other thing about a prompt without a tokenizer. That is what a model's
chat template adds to it beyond the client's strings (`PromptOverhead`). A worker measures it
when its model loads (worker/engine/prompts.py), and announces it (`keys.prompt_overhead`). The
API bounds a job's reserved tokens with it (api/jobs/reservation.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from contract.jobspec import JobSpec, Message
from contract.media.images import MARKER, names

# characters of a legacy prompt per digest
TEXT_BLOCK = 256
# what an image counts for in a match (ROUTE_MIN_CHARS): a 512-token image at 4 characters a
# token, so a turn about a screenshot is routed as one about a page of text
IMAGE_CHARS = 2048
# a prompt's deepest boundaries looked at (and a slot's held), and its first
MAX_DIGESTS = 32


def _digest(parent: str, part: object) -> str:
    canonical = json.dumps(part, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.blake2b(f"{parent}\n{canonical}".encode(), digest_size=8).hexdigest()


def cache_scope(owner: str, salt: str | None = None) -> str:
    """Whose prompt cache a job may read and add to.

    With a `cache_salt`, it is every key's that sends the same salt. Else it is its own key's
    (`owner`, from the key's SHA-256). It is "" (one cache for all) where the API takes no keys.
    A salt is stored digested: it is a shared secret."""
    if salt:
        return "salt:" + hashlib.blake2b(salt.encode(), digest_size=16).hexdigest()
    return f"key:{owner}" if owner else ""


def public_digest(text: str) -> str:
    """How a public prompt is known (PUBLIC_PROMPTS_FILE).

    A job's first message whose content has this digest is one."""
    return hashlib.sha256(text.encode()).hexdigest()


def is_public(spec: JobSpec, public: frozenset[str]) -> bool:
    """Whether the job's first message is a system prompt made public (`public`: their
    `public_digest`s)."""
    if spec.kind != "chat" or not spec.messages or not public:
        return False
    first = spec.messages[0]
    return first.role in ("system", "developer") and public_digest(first.content) in public


def _rendered(spec: JobSpec) -> list:
    """What the prompt is rendered with beside its messages.

    That is its tools and, where set, the template's kwargs. The kwargs turn thinking on or off."""
    tools = [[t.name, t.description, t.parameters] for t in spec.tools]
    return [tools, spec.template_kwargs] if spec.template_kwargs else [tools]


def _root(spec: JobSpec) -> str:
    head = [spec.model, spec.kind, *_rendered(spec)]
    return _digest("", [*head, spec.cache_scope] if spec.cache_scope else head)


def prefixes(spec: JobSpec, answer: str | None = None) -> list[tuple[str, int]]:
    """(digest, characters of prompt it covers) of each prefix, shortest first.

    With `answer`, there is one more: the conversation followed by it, as the assistant's
    message. At most MAX_DIGESTS: the first (a shared system prompt) and the deepest."""
    out: list[tuple[str, int]] = []
    public = spec.public_prompt and spec.kind == "chat"
    # a public prompt's digest is of its text alone: what a key renders with it is its own
    digest, chars = _digest("", [spec.model, spec.kind]) if public else _root(spec), 0
    if spec.kind == "chat":
        messages = list(spec.messages)
        if answer is not None:
            messages.append(Message("assistant", answer))
        images = iter(names(spec.images, spec.low_detail))
        for i, m in enumerate(messages):
            # an image is its name: the same text around another image is another prefix
            seen = [next(images) for _ in range(m.content.count(MARKER))] if i < len(spec.messages) else []
            digest = _digest(digest, {**m.to_dict(), "images": seen} if seen else m.to_dict())
            chars += len(m.content) + sum(len(c.arguments) for c in m.tool_calls) + IMAGE_CHARS * len(seen)
            out.append((digest, chars))
            # the public prompt's end: the scope's own from here
            if i == 0 and public:
                digest = _digest(digest, [spec.cache_scope, *_rendered(spec)])
    else:
        text = spec.prompt + (answer or "")
        for start in range(0, len(text) - TEXT_BLOCK + 1, TEXT_BLOCK):
            digest = _digest(digest, text[start : start + TEXT_BLOCK])
            out.append((digest, start + TEXT_BLOCK))
    return out if len(out) <= MAX_DIGESTS else [out[0], *out[-(MAX_DIGESTS - 1) :]]


@dataclass(frozen=True)
class PromptOverhead:
    """What a chat template adds to a prompt, in tokens.

    `fixed` is the template's text around any conversation. That is its default system prompt,
    the generation prompt, and a tool protocol's instructions. `per_part` is the most it adds
    around one message, tool call, tool or template argument."""

    fixed: int
    per_part: int

    def field(self) -> str:
        """As a worker announces it."""
        return f"{self.fixed} {self.per_part}"

    @classmethod
    def parse(cls, value: str) -> PromptOverhead | None:
        """An announced overhead (None: not one)."""
        parts = value.split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return None
        return cls(int(parts[0]), int(parts[1]))

    def most(self, other: PromptOverhead) -> PromptOverhead:
        """The larger of two workers' overheads, each part: a bound for jobs any of them takes."""
        return PromptOverhead(max(self.fixed, other.fixed), max(self.per_part, other.per_part))


UNKNOWN = PromptOverhead(fixed=1024, per_part=64)
"""Where no worker of a model has announced one (a pool scaled to zero before any announced):
more than any template measured (gpt-oss's harmony preamble with tools is the largest, ~300)."""
