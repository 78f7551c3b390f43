"""Which inputs go into the next decode.

A decode takes whole inputs from the waiting requests in turn. It takes as many as the batch
holds (tokens), and as many sequences as the context has.

Requests from many clients wait together, so one decode carries inputs of many requests. That
is what makes a pool of small requests fast. The keys that sent them (each request's `owner`)
take turns, one input each, while their inputs fit. So one key's requests of thousands of
inputs never fill a decode before another key's one input is in it.

A key with no input in the decode under way is a newcomer, as one beside a flood. A newcomer
goes first in the next decode. The others' inputs fill that decode only up to as many tokens
as the newcomers'. So its time is about theirs alone. A newcomer waits for the decode under
way and about its own.

Within one key's requests, inputs go oldest request first. So requests end one after another,
and their clients send the next: the way a pool keeps busy. But while others wait, no request
takes more than half a decode. A request of two inputs is not kept waiting behind one of two
thousand that came before it.

Batch API lines' inputs wait apart. They fill only the room interactive requests leave in a
decode. A request given up (its job cancelled, fenced or handed off) is dropped with whatever
it still had waiting.
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
    # a Batch API line's: it takes what room interactive ones leave
    batch: bool = False
    # the key that sent it (its job's owner): keys take turns in a decode
    owner: str = ""
    vectors: list[np.ndarray | None] = field(default_factory=list)
    # inputs handed to decodes so far, in order
    taken: int = 0
    # inputs not yet embedded
    left: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    # given up: its inputs still waiting are never decoded
    abandoned: bool = False

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
    """One input of one request, as a sequence of a decode."""

    request: Request
    index: int

    @property
    def tokens(self) -> list[int]:
        return self.request.inputs[self.index]


class Waiting:
    """The requests with inputs waiting for a decode, in arrival order (thread-safe)."""

    def __init__(self) -> None:
        self._interactive: collections.deque[Request] = collections.deque()
        # Batch API lines'
        self._lines: collections.deque[Request] = collections.deque()
        self._cv = threading.Condition()
        # the owners of the interactive inputs in the last decode
        self._last: set[str] = set()

    def add(self, request: Request) -> None:
        if request.inputs:
            with self._cv:
                (self._lines if request.batch else self._interactive).append(request)
                self._cv.notify()

    def abandon(self, request: Request) -> None:
        """Give the request up: what it still has waiting goes with it."""
        with self._cv:
            request.abandoned = True
            for queue in (self._interactive, self._lines):
                if request in queue:
                    queue.remove(request)

    def __len__(self) -> int:
        """Requests with inputs waiting."""
        with self._cv:
            return len(self._interactive) + len(self._lines)

    def next_decode(self, max_tokens: int, max_seqs: int, timeout: float | None = None) -> list[Item]:
        """Take the next decode's inputs, waiting up to `timeout` for one ([]: none came).

        Interactive ones go first, then batch lines' in the room left. Every input is at most
        `max_tokens` long: the engine refuses longer ones."""
        with self._cv:
            if not len(self) and not self._cv.wait_for(lambda: bool(len(self)), timeout):
                return []
            out, cap = self._interactive_decode(max_tokens, max_seqs)
            self._last = {item.request.owner for item in out}
            used = sum(len(item.tokens) for item in out)
            return out + take(self._lines, cap - used, max_seqs - len(out), first=not out)

    def _interactive_decode(self, max_tokens: int, max_seqs: int) -> tuple[list[Item], int]:
        """The interactive inputs of the next decode, and the most tokens it may hold.

        It runs under the lock. Newcomers are keys with no input in the last decode. When
        others wait beside them, the newcomers' inputs go first. The others' inputs (and batch
        lines') then go up to as many tokens as the newcomers took. Else every key's inputs go
        in turn, up to `max_tokens`."""
        queue = self._interactive
        fresh = collections.deque(r for r in queue if r.owner not in self._last)
        if not fresh or len(fresh) == len(queue):
            return take(queue, max_tokens, max_seqs), max_tokens
        rest = collections.deque(r for r in queue if r.owner in self._last)
        out = take(fresh, max_tokens, max_seqs)
        used = sum(len(item.tokens) for item in out)
        cap = min(2 * used, max_tokens)
        out += take(rest, cap - used, max_seqs - len(out), first=False)
        self._interactive = collections.deque(r for r in queue if r.taken < len(r.inputs))
        return out, cap


def take(
    requests: collections.deque[Request], max_tokens: int, max_seqs: int, first: bool = True
) -> list[Item]:
    """Take whole inputs for a decode, until it is full.

    The requests' owners take turns, one input each. Each owner's inputs go in the order
    `in_order` gives its own requests. An owner whose next input does not fit is done for this
    decode, and the others go on. A request whose inputs are all taken leaves the queue. With
    `first`, the decode holds nothing yet: the first input goes in whatever its length."""
    owners: dict[str, list[Request]] = {}
    for request in requests:
        owners.setdefault(request.owner, []).append(request)
    turns = [iter(in_order(mine, max_tokens, max_seqs, first)) for mine in owners.values()]
    out: list[Item] = []
    used = 0
    while turns:
        for turn in list(turns):
            item = next(turn, None)
            size = 0 if item is None else len(item.tokens)
            if item is None or len(out) >= max_seqs or ((out or not first) and used + size > max_tokens):
                turns.remove(turn)
                continue
            out.append(item)
            used += size
    # each request's in order: its next inputs
    for item in out:
        item.request.taken += 1
    for request in list(requests):
        if request.taken == len(request.inputs):
            requests.remove(request)
    return out


def in_order(requests: list[Request], max_tokens: int, max_seqs: int, first: bool = True) -> list[Item]:
    """One owner's inputs in the order a decode of its own would take them.

    Nothing is taken here. The oldest request goes first, and each request's inputs in order,
    until the next one does not fit. While other requests wait, one request takes at most half
    the decode, of its sequences and its tokens. So theirs go in beside it. Then it takes
    whatever room is left."""
    out: list[Item] = []
    taken = {id(r): r.taken for r in requests}
    used = 0

    def fill(request: Request, seqs: int, tokens: int) -> bool:
        """Take the request's next inputs, up to `seqs` of them and `tokens`. Its first goes in
        whatever its length. False once the decode is full: the next input does not fit."""
        nonlocal used
        mine = mine_tokens = 0
        while taken[id(request)] < len(request.inputs) and mine < seqs:
            index = taken[id(request)]
            size = len(request.inputs[index])
            if len(out) >= max_seqs or ((out or not first) and used + size > max_tokens):
                return False
            if mine and mine_tokens + size > tokens:
                # its share is taken: the next request's turn
                return True
            out.append(Item(request, index))
            taken[id(request)] += 1
            used, mine, mine_tokens = used + size, mine + 1, mine_tokens + size
        return len(out) < max_seqs

    shared = len(requests) > 1
    # a share each
    for request in requests:
        if not fill(
            request, max(max_seqs // 2, 1) if shared else max_seqs, max_tokens // 2 if shared else max_tokens
        ):
            break
    # then the room left, oldest first
    for request in requests:
        if not fill(request, max_seqs, max_tokens):
            break
    return out
