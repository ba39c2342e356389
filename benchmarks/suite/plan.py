"""Size a level to the time cap from the pace a server has already shown."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LevelPlan:
    num_prompts: int
    estimate_s: float | None   # None: no pace known yet, the level runs as asked
    skip: bool = False         # even one request per slot would overrun the cap twice over


def plan_level(concurrency: int, requested: int, output_len: int, tok_s: float | None,
               cap_s: float | None) -> LevelPlan:
    """How many requests to run at `concurrency` so the level fits in `cap_s` seconds.

    `tok_s` is the best output throughput measured so far for this server (a level
    at lower concurrency, or the probe); batching servers only do better at higher
    concurrency, so the estimate errs long. Counts stay multiples of `concurrency`.
    """
    if concurrency < 1 or requested < 1:
        raise ValueError(f"concurrency and requested must be >= 1, got {concurrency}, {requested}")
    if not tok_s or not cap_s:
        return LevelPlan(requested, None)
    estimate = requested * output_len / tok_s
    if estimate <= cap_s:
        return LevelPlan(requested, estimate)
    fitting = int(cap_s * tok_s / output_len) // concurrency * concurrency
    n = max(concurrency, fitting)
    return LevelPlan(n, n * output_len / tok_s, skip=n * output_len / tok_s > 2 * cap_s)
