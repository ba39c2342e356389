"""Unit tests of the suite's pure parts: level sizing and docs section replacement.

    .venv/bin/python -m pytest -q benchmarks/suite/tests
"""

import pytest

from benchmarks.suite.plan import plan_level
from benchmarks.suite.report import SERVING, replace_section


def test_plan_runs_as_asked_without_a_pace():
    assert plan_level(16, 48, 128, None, 900).num_prompts == 48
    assert plan_level(16, 48, 128, 4.0, None).num_prompts == 48


def test_plan_keeps_levels_that_fit():
    plan = plan_level(4, 16, 128, 100.0, 900)
    assert (plan.num_prompts, plan.skip) == (16, False)
    assert plan.estimate_s == pytest.approx(16 * 128 / 100.0)


@pytest.mark.parametrize("c,asked,tok_s,cap",
                         [(16, 48, 4.0, 900), (4, 16, 1.0, 600), (1, 8, 0.5, 300)])
def test_plan_shrinks_to_a_multiple_of_concurrency_within_the_cap(c, asked, tok_s, cap):
    plan = plan_level(c, asked, 128, tok_s, cap)
    assert plan.num_prompts % c == 0 and c <= plan.num_prompts < asked
    # the largest multiple of c that fits, unless even one wave does not
    fits = [n for n in range(c, asked + 1, c) if n * 128 / tok_s <= cap]
    assert plan.num_prompts == (max(fits) if fits else c)


def test_plan_skips_when_one_wave_overruns_twice_the_cap():
    plan = plan_level(16, 48, 128, 0.5, 900)   # 16 * 128 / 0.5 = 4096 s
    assert plan.skip and plan.num_prompts == 16


def test_plan_rejects_bad_counts():
    with pytest.raises(ValueError, match="concurrency"):
        plan_level(0, 8, 128, 1.0, 900)


def test_replace_section_keeps_other_sections():
    text = "# Benchmarks\n\n## Kernels\nk1\n\n" + SERVING + "\nold\n\n## Other\nx\n"
    out = replace_section(text, SERVING, SERVING + "\nnew table\n")
    assert "old" not in out and "new table" in out
    assert out.index("## Kernels") < out.index(SERVING) < out.index("## Other")
    assert "k1" in out and "\nx\n" in out


def test_replace_section_appends_when_missing():
    out = replace_section("# Benchmarks\n\n## Kernels\nk1\n", SERVING, SERVING + "\nbody\n")
    assert out.endswith(SERVING + "\nbody\n") and "k1" in out
