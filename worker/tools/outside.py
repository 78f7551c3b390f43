"""The client's strings a chat template renders outside the message contents. They are a
tool's schema and description, and an earlier call's id, name and arguments. They are also an
assistant's sent-back reasoning and a template kwarg.

The rendered template is tokenized with special tokens. So a control token's text
(`<|im_end|>`) in such a string would become that token. That token could end a turn early.
Refusing the text would refuse honest agents. A coding agent's arguments may hold a file about
chat templates. So before the template renders, each special token's text in such a string
becomes a mark. So does any part of one at either end of the string. The template's text
beside it could complete that part, as in `<function=` NAME `>`. After the render,
worker/engine/prompts.py's `_plain` tokenizes each mark as the text it stands for. It
tokenizes that text without special tokens. The rest of the string stays as the template
places and escapes it (`tojson`). Equal strings stay equal. A template's tests against its
own words (`type == "string"`) hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

# Private-use code points: no template or tokenizer gives them a meaning. Message contents'
# placeholders (worker/engine/prompts.py) use them too: no client string keeps them.
OPEN, CLOSE = "\ue000", "\ue001"
_MARK = OPEN + "tokenspool-text-{}" + CLOSE
_MARKS = re.compile(re.escape(OPEN) + r"tokenspool-text-(\d+)" + re.escape(CLOSE))


class Masker:
    """Swaps special tokens' texts in the client's strings for marks (`value`). `pieces` reads
    them back from the rendered template."""

    def __init__(self, specials: Iterable[str]) -> None:
        words = sorted({w for w in specials if w} | {OPEN, CLOSE}, key=len, reverse=True)
        self._find = re.compile("|".join(map(re.escape, words)))
        # a word's start, not all of it
        self._heads = {w[:n] for w in words for n in range(1, len(w))}
        # a word's end, the same
        self._tails = {w[n:] for w in words for n in range(1, len(w))}
        self._reach = len(words[0]) - 1

    def value(self, value: object, marks: dict[str, int]) -> object:
        """`value` with marks in its strings and keys. `value` is a template argument: strings,
        numbers, lists and dicts of them. `marks` gets the text each mark stands for, with its
        index."""
        if isinstance(value, str):
            return self._string(value, marks)
        if isinstance(value, dict):
            return {self.value(k, marks): self.value(v, marks) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v, marks) for v in value]
        return value

    def _string(self, text: str, marks: dict[str, int]) -> str:
        spans = [found.span() for found in self._find.finditer(text)]
        reach = min(len(text), self._reach)
        head = next((n for n in range(reach, 0, -1) if text[:n] in self._tails), 0)
        tail = next((n for n in range(reach, 0, -1) if text[-n:] in self._heads), 0)
        spans += [(0, head)] if head else []
        spans += [(len(text) - tail, len(text))] if tail else []
        if not spans:
            return text
        out, at = [], 0
        for start, end in _merged(spans):
            out += [text[at:start], _MARK.format(marks.setdefault(text[start:end], len(marks)))]
            at = end
        return "".join(out) + text[at:]


def pieces(rendered: str, texts: Sequence[str]) -> Iterator[tuple[str, bool]]:
    """The rendered template's text in order, as (text, is the client's). The template's own
    text lies between the marks. Each mark gives the text it stands for (`texts`, by index)."""
    at = 0
    for found in _MARKS.finditer(rendered):
        index = int(found.group(1))
        if index < len(texts):
            yield rendered[at : found.start()], False
            yield texts[index], True
            at = found.end()
    yield rendered[at:], False


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(end, out[-1][1]))
        else:
            out.append((start, end))
    return out
