"""What one batch step feeds llama.cpp: which sequences step, and their rows in slot order.

Pure functions of the scheduler's sequences. The scheduler (worker/engine/batching.py) runs
them on its thread. They are unit-tested without a model
(tests/unit/worker/engine/steps/test_plan.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.engine.steps.sequence import Sequence


def stepping(running: list[Sequence], lines_beside: int | None) -> list[Sequence]:
    """The sequences that step now.

    While an interactive sequence runs, only `lines_beside` Batch API lines (BATCH_SLOTS) step
    beside it. So the interactive streams' steps carry no more batch rows than with BATCH_SLOTS
    alone. The lines beyond them sit out: those in slots lent while interactive jobs were quiet
    (BATCH_LEND_SLOTS). They keep their slot, cache and pending token. They sit out until no
    interactive sequence runs, or until a line that steps ends.

    The lines that step are those whose slots lie nearest an interactive one's. With a cache
    split by sequence, llama.cpp computes a step in one pass only over consecutive slots (see
    `plan`). So lines in slots 0-15 beside a stream in slot 16 step from slot 8 up, in one
    pass. They do not step as 0-7 and 16, in two. None: every sequence steps.

    The suspects are jobs that stood still where workers died (api/cluster/reaper.py). They
    step as one group until each has generated `alone_for` tokens. They step beside the
    streams that decode, but apart from every other job still reading its context. A death
    meanwhile is the suspects'. It is charged to a suspect alone, else it halves the group they
    may step in. The reason: a job that kills where it stands kills before it goes on, its
    prompt's read included. And a stream that decodes has gone on.

    Streams that decode are not held up by a proof. A storm's proofs, one after another, once
    left a worker's streams 20 s without a token. Jobs still reading wait those few steps,
    keeping their slots. The worker takes no more suspects than one of them may step with."""
    if suspects := proving(running):
        return [s for s in running if s in suspects or s.pending is not None]
    lines = [s for s in running if s.yields]
    if lines_beside is None or len(lines) <= lines_beside or len(lines) == len(running):
        return running
    near = [s.slot for s in running if not s.yields]
    chosen = sorted(lines, key=lambda s: (min(abs(s.slot - i) for i in near), s.slot))[:lines_beside]
    kept = {id(s) for s in chosen}
    return [s for s in running if not s.yields or id(s) in kept]


def proving(running: list[Sequence]) -> list[Sequence]:
    """The suspects still proving themselves (`stepping`)."""
    return [s for s in running if s.generated < s.alone_for]


def budgeted(steps: list[Sequence]) -> bool:
    """Whether a step's prompt reads are budgeted (`plan`'s `budget`).

    The budget keeps interactive streams' gaps short. Batch API lines alone have none. Nor has
    a step of suspects proving. The jobs still reading wait for them, so the sooner they are
    read, the better."""
    return not proving(steps) and any(s.pending is not None and not s.yields for s in steps)


def plan(
    running: list[Sequence],
    chunk: int,
    batch_chunk: int | None = None,
    budget: int | None = None,
    alone: int = 0,
) -> list[tuple[Sequence, int, bool]]:
    """The rows of one step's batch: (sequence, token, wants logits).

    Each decoding sequence feeds its last sampled token. Each sequence still reading its
    context feeds up to `chunk` more of it. Every step is at least one pass over all the
    weights. So a burst of jobs is read in one step, not one job after another. A short prompt
    admitted behind a long one is not held up by it. The running streams wait one step of at
    most `chunk` tokens per prefilling sequence.

    The rows are ordered by slot, each sequence's tokens together. This is for a cache split
    by sequence (non-unified). For it, llama.cpp's `split_equal(sequential=true)` takes into
    one pass only sequence ids that follow each other in batch order (0, 1, 2, ...). So a
    batch listing slots 3, 0, 2, 1 is computed in several passes, each reading all the weights
    (`bench/probes/batch_order.py`).

    `alone` (PREFILL_ALONE) is for a step where no sequence decodes. Nothing waits on that
    step's time, so the interactive prompts share `alone` rows, at least `chunk` each. A lone
    long prompt is thus read at llama.cpp's micro-batch (512), not `chunk` tokens a step. In
    issue 76, an agent's 1,500-token opening, read 64 tokens a step on 4 slots, came 1.48x
    later than llama-server's.

    `budget`, while streams decode (see `StepCost`), is the prompt tokens this step may read
    in all. They go to the prompts with the least left to read first. A prompt longer than a
    chunk is read a little every step, at least a token. So the running streams' steps stay
    short while it is read. One that fits in a chunk is read whole, as without a budget. So a
    new request's first token is not spread over many steps. A new request may be a burst's
    straggler, or a chat turn arriving beside the long prompt.

    A resumed job's context reads like a prompt: its prompt and the text earlier attempts
    generated. But the continuations' rows are pooled. They go to the longest stalled first
    (`since`), each up to its whole context. Without that pooling, a worker that took over a
    dead batch of 30 read a little of each a step. So none went on before the whole batch was
    read: 20-40 s on two cores shared with workers loading. In a crash storm the next death
    came first, again and again. A stream went 178 s without a token (bench/faults/chaos.py
    --storm). The step's rows, and so its time, are as before. A suspect's steps alone
    (`stepping`) are unbudgeted. None: every prompt reads its chunk.

    Batch API lines (`yields`) sit out every step in which an interactive sequence reads its
    prompt. That step is as short as on an idle worker. The interactive job's first token is
    not held up by the batch (bench/batch_priority.py), and the lines lose one step. They read
    their own prompts `batch_chunk` tokens a step (BATCH_PREFILL_CHUNK). So an interactive job
    that arrives meanwhile waits for a short step, not a long one. With the budget spent they
    still read a token a step, the row each adds when decoding. So lines that end while a
    stream decodes are replaced, not left empty until it ends.
    """
    prefilling = any(not s.yields and s.pending is None and s.fed < len(s.context) for s in running)
    # a yielding token waits
    stepping = [s for s in running if not (s.yields and prefilling)]
    # id(sequence) -> prompt tokens it reads this step
    reads: dict[int, int] = {}
    left = budget
    # an image's rows are read before the step (worker/engine/batching.py): text stops at one
    readers = [s for s in stepping if s.pending is None and s.text_left() > 0]
    interactive = sum(not s.yields for s in readers)
    decoding = any(s.pending is not None for s in stepping)
    share = max(chunk, alone // interactive) if alone and interactive and not decoding else chunk
    for seq in sorted(readers, key=lambda s: (s.yields, len(s.context) - s.fed, s.slot)):
        rest = seq.text_left()
        step = min((batch_chunk or chunk) if seq.yields else share, rest)
        if left is not None:
            # a long prompt is spread out
            if seq.yields or rest > chunk:
                step = max(min(step, left), 1)
            # a short interactive prompt is read whole: one longer step, once
            left -= step
        reads[id(seq)] = step
    resumed = sorted((s for s in readers if s.since and not s.yields), key=lambda s: (s.since, s.slot))
    # their rows, given out again oldest first
    pool = sum(reads.pop(id(s)) for s in resumed)
    for seq in resumed:
        if pool and (step := min(seq.text_left(), pool)):
            reads[id(seq)], pool = step, pool - step
    rows: list[tuple[Sequence, int, bool]] = []
    for seq in sorted(stepping, key=lambda s: s.slot):
        if seq.pending is not None:
            rows.append((seq, seq.pending, True))
            seq.pending = None
        elif id(seq) in reads:
            end = seq.fed + reads[id(seq)]
            rows.extend((seq, seq.context[i], i == len(seq.context) - 1) for i in range(seq.fed, end))
            seq.fed = end
    return rows


def compaction(running: list[int], free: list[int]) -> list[tuple[int, int]]:
    """Moves (from slot, to slot) that leave the running slots consecutive.

    A step is computed by llama.cpp in one pass only over consecutive slots (see `plan`). So
    a job ending in the middle (slots 0-2 and 4-7 running) costs a second pass on every step.
    That lasts until a new job takes its slot (docs/benchmarks.md). When no job does, the
    highest running sequence moves into the lowest gap: llama.cpp copies its slot's KV once.
    """
    running, free = sorted(running), sorted(free)
    moves: list[tuple[int, int]] = []
    while running:
        gaps = [s for s in free if running[0] < s < running[-1]]
        if not gaps:
            return moves
        src, dst = running.pop(), gaps[0]
        moves.append((src, dst))
        free.remove(dst)
        running = sorted([*running, dst])
        free.append(src)
    return moves


# tokens at a cache's end that a next turn may render otherwise (its answer re-tokenized)
TAIL = 4
# tokens of shared prefix not worth evicting a more recent conversation for
NEAR = 64


def shareable(
    kv: list[list[int]], scopes: list[str], context: list[int], scope: str, public: int
) -> list[int]:
    """How many of each slot's cached tokens a new job may reuse.

    The job has its `context` and its cache `scope`. It may reuse all of a cache of its scope.
    Of another scope's cache, it may reuse its `public` first tokens, if the cache starts with
    exactly those. Else it reuses none. The `public` tokens are a public prompt's text,
    rendered without the job's tools and template kwargs (prompts.py `public_tokens`)."""
    head = context[:public]
    return [
        len(cached) if slot_scope == scope else public if public and cached[:public] == head else 0
        for cached, slot_scope in zip(kv, scopes, strict=True)
    ]


def choose_slot(
    free: list[int],
    kv: list[list[int]],
    context: list[int],
    ended: list[int],
    shares: list[int] | None = None,
) -> int:
    """The free slot a new sequence takes.

    `kv` is each slot's cached tokens. `ended` is when each slot's last job ended, a tick, 0
    for never. `shares` is how many of each slot's cached tokens the new job may share, by its
    cache scope (contract/prefixes.py). That is all of a cache of its scope, and of another
    scope's nothing but a public prompt. None: all of every one.

    A slot keeps its last job's cache for the next job that shares a prefix with it. That is a
    conversation's next turn, or prompts with one system prompt. So the slot whose whole cache
    the new context extends is taken first. The new job is then its conversation's next turn,
    and nothing else is lost.

    Otherwise a slot is evicted. Among those sharing nearly the longest prefix (within NEAR
    tokens), an empty one goes first. Else it is the one whose job ended longest ago. So a new
    conversation does not overwrite a recent one for the chat template's few shared tokens.
    Cache-aware routing (api/jobs/routing.py) may be sending the recent one's next turn here.
    Ties go to the lowest slot. `compaction` closes the gaps this may leave."""
    shares = shares or [len(c) for c in kv]
    shared = {s: min(common_prefix(kv[s], context), shares[s]) for s in free}
    extended = [s for s in free if kv[s] and shares[s] >= len(kv[s]) and shared[s] >= len(kv[s]) - TAIL]
    if extended:
        return max(extended, key=lambda s: (shared[s], -s))
    best = max(shared.values())
    near = [s for s in free if shared[s] >= best - NEAR]
    return min(near, key=lambda s: (bool(kv[s]), ended[s], s))


# cells copied per token of prompt a copy saves reading, at most (see prefix_source)
COPY_RATIO = 128


def prefix_source(
    slot: int, kv: list[list[int]], context: list[int], shares: list[int] | None = None
) -> tuple[int, int] | None:
    """Where a new sequence taking `slot` copies the cached prefix of its `context` from.

    It returns (source slot, tokens to keep). None when no other slot's cache (running or
    free) holds more of it than `slot`'s own. Only what the job may share counts (`shares`, as
    for `choose_slot`). `choose_slot` keeps a conversation's cache from a new job. But the job
    need not read again what that cache holds: the shared prefix is copied into its own slot.
    The last context token is read all the same, for its logits.

    A copy costs by the cells the source holds: all of them are copied, then cut to the
    prefix. Reading costs by the tokens. With SmolLM2 on two cores a cell copies in ~5 us,
    and a token reads in ~2 ms. A copy is made when it saves at least one token for every
    COPY_RATIO cells. It is made from the shortest cache among those sharing the most."""
    limit = len(context) - 1
    shares = shares or [len(c) for c in kv]
    own = min(common_prefix(kv[slot], context), limit, shares[slot])
    # (tokens kept, -cells copied, -slot): the best is the largest
    found = []
    for src, cached in enumerate(kv):
        keep = min(common_prefix(cached, context), limit, shares[src])
        if src != slot and keep > own and (keep - own) * COPY_RATIO >= len(cached):
            found.append((keep, -len(cached), -src))
    if not found:
        return None
    keep, _, src = max(found)
    return -src, keep


def spare_slot(
    free: list[int], kv: list[list[int]], ended: list[int], avoid: set[int], than: int
) -> int | None:
    """A free slot to keep a cache that a compaction move would overwrite.

    That cache is a conversation that ended at tick `than`. The slot is an empty one, else the
    least recently used that ended before it. It is never one in `avoid` (the moves'
    targets). None: the cache is the oldest."""
    spares = [t for t in free if t not in avoid and (not kv[t] or ended[t] < than)]
    return min(spares, key=lambda t: (bool(kv[t]), ended[t], t)) if spares else None


def batch_capacity(slots: int, chunk: int, alone: int = 0) -> int:
    """The most rows a step can have (see `plan`): the context's batch size."""
    return max(slots * chunk, alone)


def common_prefix(a: list[int], b: list[int], block: int = 256) -> int:
    """The length of the prefix `a` and `b` share. Whole blocks are compared as slices, in C.
    A new job is compared with every slot's cache, thousands of tokens each."""
    n = min(len(a), len(b))
    start = 0
    while start < n and a[start : start + block] == b[start : start + block]:
        start += block
    if start >= n:
        return n
    end = min(start + block, n)
    return next((i for i in range(start, end) if a[i] != b[i]), end)
