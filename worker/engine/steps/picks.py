"""What the sampler hands the job for each generated token. Reading it needs no llama.cpp:
the synthetic engine makes them too."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pick:
    """A sampled token and its log-probability. It carries the top alternatives' too, if asked for."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()
