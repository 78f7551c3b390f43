"""What the sampler hands the job for each generated token (no llama.cpp needed to read it:
the synthetic engine makes them too)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pick:
    """A sampled token, with its log-probability and the top alternatives' if asked for."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()
