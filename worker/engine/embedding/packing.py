"""Which inputs go into the next decode: whole inputs, oldest request first, as many as the
batch holds (tokens) and as many sequences as the context has.

Requests from many clients wait together, so one decode carries inputs of many requests
(what makes a pool of small requests fast), and no request waits behind ones that came
after it: the oldest waiting input always goes first. Batch API lines' inputs wait apart and
fill only the room interactive requests leave in a decode.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class Request:
    """One job's inputs, and their vectors as decodes fill them in."""

    inputs: list[list[int]]
    batch: bool = False  # a Batch API line's: it takes what room interactive ones leave
    vectors: list[np.ndarray | None] = field(default_factory=list)
    left: int = 0  # inputs not yet embedded
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.vectors = [None] * len(self.inputs)
        self.left = len(self.inputs)
        if not self.inputs:
            self.done.set()

    def fill(self, index: int, vector: np.ndarray) -> None:
        self.vectors[index] = vector
        self.left -= 1
        if not self.left:
            self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


@dataclass(frozen=True)
class Item:
    """One input of one request, as a row range of a decode."""

    request: Request
    index: int

    @property
    def tokens(self) -> list[int]:
        return self.request.inputs[self.index]


class Waiting:
    """The inputs waiting for a decode, in arrival order (thread-safe)."""

    def __init__(self) -> None:
        self._interactive: collections.deque[Item] = collections.deque()
        self._lines: collections.deque[Item] = collections.deque()  # Batch API lines'
        self._cv = threading.Condition()

    def add(self, request: Request) -> None:
        with self._cv:
            line = self._lines if request.batch else self._interactive
            line.extend(Item(request, i) for i in range(len(request.inputs)))
            self._cv.notify()

    def __len__(self) -> int:
        with self._cv:
            return len(self._interactive) + len(self._lines)

    def next_decode(self, max_tokens: int, max_seqs: int, timeout: float | None = None) -> list[Item]:
        """Take the next decode's inputs, waiting up to `timeout` for one ([]: none came):
        interactive ones first, then batch lines' in the room left. Every input is at most
        `max_tokens` long (the engine refuses longer ones)."""
        with self._cv:
            if not len(self) and not self._cv.wait_for(lambda: bool(len(self)), timeout):
                return []
            out = pack(self._interactive, max_tokens, max_seqs)
            used = sum(len(item.tokens) for item in out)
            return out + pack(self._lines, max_tokens - used, max_seqs - len(out), first=not out)


def pack(items: collections.deque[Item], max_tokens: int, max_seqs: int, first: bool = True) -> list[Item]:
    """Pop the oldest inputs that fit together: whole ones, in order, stopping at the first
    that does not fit (the oldest is never passed over). With `first`, the decode holds
    nothing yet: the oldest goes in whatever its length."""
    out: list[Item] = []
    tokens = 0
    while items and len(out) < max_seqs:
        size = len(items[0].tokens)
        if (out or not first) and tokens + size > max_tokens:
            break
        out.append(items.popleft())
        tokens += size
    return out
