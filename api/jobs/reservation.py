"""How many prompt tokens a job reserves against its key's token budget. It is a bound no
tokenizer exceeds, not a guess (docs/security.md, "Token limits").

The API has no tokenizer. A token is at least one byte of UTF-8 on every tokenizer llama.cpp
runs. These are byte-level BPE, and SentencePiece with byte fallback. SentencePiece may add
one leading space per piece. So a string tokenized as plain text costs at most its bytes and
one. A template may render a string as JSON: a tool's schema, a call's arguments, a tool's
result. Such a string may be escaped first and indented. Jinja's `tojson` escapes `<` as
`\\u003c`, and any non-ASCII character becomes `\\uXXXX`. So each character is counted as
what its escape could be. The template's own text is what its workers measured and announced
(contract/prefixes.py). A job's reservation is then no more than its model's context. No
job's prompt and completion together exceed that.
"""

from __future__ import annotations

from collections.abc import Sequence

from contract.jobspec import JobSpec
from contract.prefixes import PromptOverhead

# the widest indent a template's `tojson` is given (Llama 3's, Hermes')
INDENT = 4
EMBED_SPECIALS = 4
"""What a string embedding input may be besides a token a byte: a leading space (SentencePiece's),
BOS, EOS or SEP, and a space before them."""


def plain(text: str) -> int:
    """A string tokenized as plain text: at most a token a byte, and one leading space."""
    return len(text.encode()) + 1 if text else 0


def _char(c: str) -> int:
    """The longest a character becomes in JSON: `\\uXXXX` (twice beyond the BMP), `\\"`."""
    code = ord(c)
    if code > 0xFFFF:
        return 12
    if code >= 0x80 or code < 0x20 or c in "<>&'":
        return 6
    return 2 if c in '"\\' else 1


def as_json(value: object, depth: int = 0) -> int:
    """The longest `value` can be as a template renders it in JSON, escaped and indented."""
    if isinstance(value, str):
        return 2 + sum(_char(c) for c in value)
    # a comma, a newline and the indent before each member
    line = 3 + INDENT * (depth + 1)
    if isinstance(value, dict):
        return 2 + sum(as_json(str(k)) + 2 + as_json(v, depth + 1) + line for k, v in value.items())
    if isinstance(value, list | tuple):
        return 2 + sum(as_json(v, depth + 1) + line for v in value)
    # a number, true, false, null
    return len(str(value)) + 4


def embedding_inputs(inputs: Sequence[str | Sequence[int]]) -> int:
    """The most tokens embedding inputs can be. A token array counts its ids exactly. A
    string counts its UTF-8 bytes and EMBED_SPECIALS. The bound also caps one request's work
    (MAX_EMBEDDING_TOKENS). An estimate there would let text of a token a character (digits)
    through at several times its count."""
    return sum(len(x.encode()) + EMBED_SPECIALS if isinstance(x, str) else len(x) for x in inputs)


def prompt_tokens(spec: JobSpec, overhead: PromptOverhead) -> int:
    """The most tokens the job's prompt can be, on a worker that announced `overhead`."""
    if spec.kind == "text":
        # a BOS; the raw prompt's special tokens are shorter as tokens
        return plain(spec.prompt) + 1
    if spec.kind == "embed":
        return embedding_inputs(spec.inputs)
    parts = len(spec.messages) + len(spec.tools) + len(spec.template_kwargs)
    strings = 0
    for m in spec.messages:
        parts += len(m.tool_calls)
        # a tool's result, and an answer beside its calls, may go into the calls' JSON
        in_json = m.role == "tool" or bool(m.tool_calls)
        strings += (as_json if in_json else plain)(m.content) + plain(m.reasoning)
        strings += as_json(m.tool_call_id) if m.tool_call_id else 0
        strings += sum(as_json(c.id) + as_json(c.name) + as_json(c.arguments) for c in m.tool_calls)
    strings += sum(as_json([t.name, t.description, t.parameters]) for t in spec.tools)
    strings += as_json(spec.template_kwargs) if spec.template_kwargs else 0
    strings += as_json(spec.response_format) if spec.response_format else 0
    return overhead.fixed + overhead.per_part * parts + strings
