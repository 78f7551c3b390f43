"""A job's sequence in the shared batch, as plain data. The scheduler
(worker/engine/batching.py) feeds it, and the step planner (plan.py) reads it. It is free of
llama.cpp, so the planner's tests run without it."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from worker.engine.steps.picks import Pick

if TYPE_CHECKING:
    from worker.engine.sampling import Sampler

# the sequence's window is full: no more tokens
END = object()


@dataclass(eq=False)
class Sequence:
    """One job's sequence. The job thread iterates it, and the scheduler feeds it by its courier."""

    # the prompt plus what earlier attempts generated
    context: list[int]
    sampler: Sampler
    # tokens that may be generated before the slot's window is full
    room: int
    slot: int = -1
    # context tokens in the KV cache
    fed: int = 0
    # the last sampled token, fed at the next step
    pending: int | None = None
    generated: int = 0
    closed: bool = False
    # a Batch API line: it sits out the steps that read an interactive prompt
    yields: bool = False
    # its cache scope (contract/prefixes.py): it reuses only caches of its scope
    scope: str = ""
    # except these first tokens (a public prompt's): any scope's cache may give them
    public: int = 0
    # a suspect (api/cluster/reaper.py) steps apart until it has generated this many
    alone_for: int = 0
    # a continuation: when its stream last moved (ms, Unix); oldest read first (plan.py)
    since: int = 0
    # after each step that computed any of its rows
    progress: Callable[[], None] | None = None
    # context tokens its slot's cache held when it was given the slot
    cached: int = 0
    # an image's rows: context position -> its embeddings (rows x n_embd), read in a decode of
    # their own (a llama.cpp batch holds tokens or embeddings); the context holds stand-in ids there
    images: dict[int, Any] = field(default_factory=dict)
    out: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)

    def text_left(self) -> int:
        """Context tokens to read before the next image's rows (or the context's end)."""
        return min((at for at in self.images if at >= self.fed), default=len(self.context)) - self.fed

    def image_at(self, position: int) -> int:
        """Where the image whose rows hold `position` starts (`position` itself if none does).
        A cached prefix is cut there, as an image is read whole or not at all."""
        for at, rows in self.images.items():
            if at < position < at + len(rows):
                return at
        return position

    def __iter__(self) -> Iterator[Pick]:
        while True:
            item = self.out.get()
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
