"""Size a level to the time cap from the pace a server has already shown."""

from __future__ import annotations

from dataclasses import dataclass

# A level is skipped only when a single wave is estimated past this many caps: it keeps
# a broken server from eating the run's hours. The MLX peers' c=16 wave is ~4 caps.
SKIP_FACTOR = 8


@dataclass(frozen=True)
class LevelPlan:
    num_prompts: int
    estimate_s: float | None   # None: no pace known yet, the level runs as asked
    skip: bool = False         # even one wave would overrun SKIP_FACTOR caps


def plan_level(concurrency: int, requested: int, request_s: float | None,
               cap_s: float | None) -> LevelPlan:
    """How many requests to run at `concurrency` so the level fits in `cap_s` seconds.

    `request_s` is seconds per request run one after another: one request alone
    (the probe) or the best measured level's duration over its requests. Servers
    that batch only do better at higher concurrency, so the estimate errs long.
    A capped level keeps a multiple of `concurrency` requests and never fewer than
    one full wave (or than `requested`, if that is less), so the highest level's TTFT
    is measured with every slot busy even when that wave overruns the cap.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if requested < 1:
        raise ValueError(f"requested must be >= 1, got {requested}")
    if request_s is not None and not request_s > 0:
        raise ValueError(f"request_s must be > 0 seconds or None, got {request_s}")
    if cap_s is not None and not cap_s > 0:
        raise ValueError(f"cap_s must be > 0 seconds or None, got {cap_s}")
    if request_s is None:
        return LevelPlan(requested, None)
    estimate = requested * request_s
    if cap_s is None or estimate <= cap_s:
        return LevelPlan(requested, estimate)
    fitting = int(cap_s / request_s) // concurrency * concurrency
    n = min(requested, max(concurrency, fitting))
    return LevelPlan(n, n * request_s, skip=n * request_s > SKIP_FACTOR * cap_s)
