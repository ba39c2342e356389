"""Level sizing under the time cap.

    .venv/bin/python -m pytest -q benchmarks/suite/tests
"""

import pytest

from benchmarks.suite.plan import SKIP_FACTOR, plan_level


def largest_fitting(c: int, asked: int, request_s: float, cap: float) -> int:
    """Brute force: the largest multiple of c up to `asked` that fits the cap, else one wave."""
    fits = [n for n in range(c, asked + 1, c) if n * request_s <= cap]
    return max(fits) if fits else min(c, asked)


def test_plan_runs_as_asked_without_a_pace_or_a_cap():
    assert plan_level(16, 48, None, 180).num_prompts == 48
    assert plan_level(16, 48, None, 180).estimate_s is None
    plan = plan_level(16, 48, 40.0, None)
    assert (plan.num_prompts, plan.skip) == (48, False)
    assert plan.estimate_s == pytest.approx(48 * 40.0)


def test_plan_keeps_levels_that_fit():
    plan = plan_level(4, 16, 2.5, 180)
    assert (plan.num_prompts, plan.skip) == (16, False)
    assert plan.estimate_s == pytest.approx(16 * 2.5)


@pytest.mark.parametrize("c,asked,request_s,cap",
                         [(1, 8, 41.6, 180), (4, 16, 41.0, 180), (4, 16, 20.0, 180),
                          (16, 48, 2.0, 70), (16, 48, 5.0, 180), (1, 8, 100.0, 150)])
def test_plan_shrinks_to_a_multiple_of_concurrency_within_the_cap(c, asked, request_s, cap):
    plan = plan_level(c, asked, request_s, cap)
    assert asked * request_s > cap   # every case here overruns when run as asked
    assert plan.num_prompts == largest_fitting(c, asked, request_s, cap)
    assert plan.num_prompts % c == 0 and c <= plan.num_prompts < asked
    assert plan.estimate_s == pytest.approx(plan.num_prompts * request_s)
    assert not plan.skip


def test_plan_runs_one_full_wave_even_past_the_cap():
    # The MLX peers at c=16: one wave is ~4 caps, and it still runs, whole.
    plan = plan_level(16, 48, 41.0, 180)
    assert (plan.num_prompts, plan.skip) == (16, False)
    assert plan.estimate_s > 180


def test_plan_never_runs_more_than_asked():
    assert plan_level(16, 3, 50.0, 60).num_prompts == 3


def test_plan_skips_when_one_wave_overruns_many_caps():
    cap = 100.0
    request_s = SKIP_FACTOR * cap / 16 * 1.01   # one wave of 16 just past SKIP_FACTOR caps
    plan = plan_level(16, 48, request_s, cap)
    assert plan.skip and plan.num_prompts == 16
    assert not plan_level(16, 48, SKIP_FACTOR * cap / 16 * 0.99, cap).skip


@pytest.mark.parametrize("kwargs,name", [
    ({"concurrency": 0}, "concurrency"), ({"requested": 0}, "requested"),
    ({"request_s": 0.0}, "request_s"), ({"request_s": -1.0}, "request_s"),
    ({"cap_s": 0.0}, "cap_s"),
])
def test_plan_rejects_bad_arguments_by_name(kwargs, name):
    args = {"concurrency": 4, "requested": 16, "request_s": 2.0, "cap_s": 180.0, **kwargs}
    with pytest.raises(ValueError, match=name):
        plan_level(**args)
