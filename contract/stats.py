"""Cluster-wide counters.

This module names the fields of the STATS hash (contract/keys.py) that /metrics reads. It also
says what a worker's scheduler counts, and adds to the hash with each announcement."""

from __future__ import annotations

from dataclasses import dataclass


class StatField:
    """Field names of the STATS hash."""

    @staticmethod
    def tokens(model: str) -> str:
        """Tokens generated for `model`, by every attempt of every job."""
        return f"tokens:{model}"

    @staticmethod
    def requeued(reason: str) -> str:
        """Attempts taken over by another worker, by reason.

        "crash": the reaper found the attempt dead. "handoff": a worker shutting down gave its
        job back. "preempt": a worker gave a batch line back to make room for an interactive job."""
        return f"requeued:{reason}"

    # jobs ended with worker_lost once their attempts were used up
    LOST = "lost"

    @staticmethod
    def routed(model: str) -> str:
        """New jobs routed to the worker holding their prompt's prefix (api/jobs/routing.py)."""
        return f"routed:{model}"

    @staticmethod
    def route_fallbacks(model: str) -> str:
        """Routed jobs their worker did not take by their deadline (or died with).

        They moved back to the shared queue."""
        return f"route-fallbacks:{model}"

    @staticmethod
    def batch(counter: str, model: str) -> str:
        """One of `BatchCounters`, summed over `model`'s workers."""
        return f"batch:{counter}:{model}"


# BatchCounters that say how much now: announced, never summed into STATS
LEVELS = ("host_bytes",)


@dataclass
class BatchCounters:
    """What a worker's batching scheduler has done.

    Each announcement adds what changed since the last one to STATS (`StatField.batch`). So a
    killed worker loses at most one announcement's worth."""

    # llama_decode calls
    steps: int = 0
    # sequences in those calls, summed: mean occupancy = sequences / steps
    sequences: int = 0
    # prompt tokens computed (a resumed job's earlier tokens included),
    prefill_tokens: int = 0
    # not counting those its slot's cache already held
    # sequences moved to close a gap between slots (worker/engine/steps/plan.py)
    moves: int = 0
    # ended conversations' caches copied out of a move's way (the same)
    kept: int = 0
    # new jobs' cached prefixes copied from another slot (the same: prefix_source)
    copied: int = 0
    # steps of Batch API lines stopped for an interactive job (interrupt.py)
    interrupted: int = 0
    # prompt tokens of the jobs admitted into slots (earlier attempts' included)
    prompt_tokens: int = 0
    # of them, those a slot's cache already held (prefill saved)
    cached_tokens: int = 0
    # jobs taken from this worker's own routed queues (the router's hits)
    routed_taken: int = 0
    # The host tier of the prompt cache (worker/engine/cache/): its restores count in cached_tokens
    # jobs whose prefix was restored from host memory into their slot
    host_hits: int = 0
    # the prompt tokens those restores held (not read again)
    host_restored_tokens: int = 0
    # slots' states kept in host memory before being written over
    host_saved: int = 0
    # kept states dropped for the bound, least recently used first
    host_evictions: int = 0
    # a level, not a count: the bytes kept now (in the worker's load line, LEVELS)
    host_bytes: int = 0
    # Where a worker's time goes (a step's profile: bench/gpu_run divides them):
    # inside llama_decode
    decode_us: int = 0
    # from llama_decode's return to its logits (a GPU still computing)
    wait_us: int = 0
    # picking every sequence's token from a step's logits (the scheduler thread)
    sample_us: int = 0
    # the job threads' own Python per token (stops, tool calls, logprobs, queueing)
    token_us: int = 0
    # tokens the job threads handled
    tokens: int = 0
    # the publisher's round trips to Redis (APPENDs)
    publish_us: int = 0
    # those round trips
    publishes: int = 0

    def plus(self, other: BatchCounters) -> BatchCounters:
        """Field by field: the scheduler's counters and the job threads' make the worker's."""
        return BatchCounters(**{f: getattr(self, f) + getattr(other, f) for f in self.__dataclass_fields__})
