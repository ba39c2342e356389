"""Transparent huge pages: span planning, maps parsing, and the real madvise calls on
mx.arrays (weights: contents kept, pages now 2 MiB per smaps; a zeroed cache:
released, read as zeros, written back onto a huge page)."""

from __future__ import annotations

import re
import sys

import mlx.core as mx
import numpy as np
import pytest

from vllm_metal.cpu.huge_pages import (
    HUGE_PAGE,
    anonymous_mappings,
    array_ranges,
    back_with_huge_pages,
    plan_spans,
    zeros_on_huge_pages,
)

MiB = 1 << 20


def test_plan_spans_hull_per_mapping_aligned_inward():
    mapping = (0, 64 * MiB)
    # Two weights 3 MiB apart: one span from the first's start to the second's end,
    # shrunk to whole 2 MiB pages.
    weights = [(1 * MiB + 100, 3 * MiB), (6 * MiB, 9 * MiB + 5)]
    assert plan_spans(weights, [mapping]) == [(2 * MiB, 8 * MiB)]


def test_plan_spans_separate_mappings_and_tiny_spans():
    a, b = (0, 16 * MiB), (32 * MiB, 48 * MiB)
    weights = [(1 * MiB, 7 * MiB), (33 * MiB, 34 * MiB + 10)]   # the second holds no whole page
    outside = [(20 * MiB, 30 * MiB)]                              # in no anonymous mapping
    assert plan_spans(weights + outside, [b, a]) == [(2 * MiB, 6 * MiB)]


def test_plan_spans_clips_a_weight_to_each_mapping_it_crosses():
    weights = [(3 * MiB, 13 * MiB)]
    assert plan_spans(weights, [(0, 8 * MiB), (9 * MiB, 16 * MiB)]) == [
        (4 * MiB, 8 * MiB), (10 * MiB, 12 * MiB)]


def test_plan_spans_joins_touching_mappings_across_an_unaligned_boundary():
    # Earlier advice split one region at 5 MiB + 4 KiB: the page at [4, 6) MiB straddles
    # the split, and would be lost if each piece were shrunk to whole pages on its own.
    split = 5 * MiB + 4096
    mappings = [(split, 16 * MiB), (0, split), (20 * MiB, 32 * MiB)]
    weights = [(1 * MiB, 4 * MiB + 100), (4 * MiB + 200, 13 * MiB), (21 * MiB, 31 * MiB)]
    assert plan_spans(weights, mappings) == [(2 * MiB, 12 * MiB), (22 * MiB, 30 * MiB)]


def test_plan_spans_other_page_size():
    assert plan_spans([(5, 100)], [(0, 128)], page=16) == [(16, 96)]


def test_anonymous_mappings_keeps_private_writable_anonymous_and_heap():
    maps = "\n".join([
        "55d0c0000000-55d0c4000000 rw-p 00000000 00:00 0                          [heap]",
        "7f0000000000-7f0000400000 rw-p 00000000 00:00 0 ",
        "7f0000400000-7f0000600000 r--p 00000000 08:01 123                        /usr/lib/libc.so.6",
        "7f0000600000-7f0000800000 rw-p 00001000 08:01 123                        /usr/lib/libc.so.6",
        "7f0000800000-7f0000a00000 rw-s 00000000 00:05 77                         /dev/shm/x",
        "7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]",
    ])
    assert anonymous_mappings(maps) == [(0x55D0C0000000, 0x55D0C4000000),
                                        (0x7F0000000000, 0x7F0000400000)]


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return re.search(r"\[(\w+)\]", f.read()).group(1)
    except (OSError, AttributeError):
        return "never"


def _huge_bytes(lo: int, hi: int, field: str = "AnonHugePages") -> int:
    """``field`` (bytes) of the mappings overlapping [lo, hi), from /proc/self/smaps."""
    total, overlaps = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
            if head:
                start, end = int(head.group(1), 16), int(head.group(2), 16)
                overlaps = start < hi and end > lo
            elif overlaps and line.startswith(field + ":"):
                total += int(line.split()[1]) * 1024
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux madvise")
def test_back_with_huge_pages_keeps_contents_and_maps_huge_pages():
    rng = np.random.default_rng(0)
    expected = rng.integers(0, 2**32, size=24 * MiB // 4, dtype=np.uint32)
    weight = mx.array(expected)
    mx.eval(weight)
    (lo, hi), = array_ranges([weight])
    assert hi - lo == expected.nbytes

    report = back_with_huge_pages([(lo, hi)])

    assert report.weight_bytes == expected.nbytes
    np.testing.assert_array_equal(np.array(weight), expected)
    if _thp_mode() == "never" or any("EINVAL" in e for e in report.errors):
        pytest.skip(f"no transparent huge pages here ({_thp_mode()}, {report.errors})")
    assert report.errors == ()
    # All but the partial pages at the two ends of the buffer.
    assert report.weights_collapsed >= expected.nbytes - 2 * HUGE_PAGE
    assert report.collapsed_bytes >= report.weights_collapsed
    assert _huge_bytes(lo, hi) >= report.weights_collapsed // HUGE_PAGE * HUGE_PAGE
    # The array still computes with its (now huge-page) memory.
    assert int(mx.sum(weight.astype(mx.uint64)).item()) == int(expected.astype(np.uint64).sum())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux madvise")
def test_back_with_huge_pages_across_a_mapping_split_off_center():
    # Earlier advice (here: MADV_NOHUGEPAGE on one 4 KiB page that is not 2 MiB-aligned)
    # splits the buffer's mapping in three; the pages around the splits must still be
    # collapsed, as they are when the heap was split by an earlier load.
    import ctypes

    expected = np.arange(24 * MiB // 4, dtype=np.uint32)
    weight = mx.array(expected)
    mx.eval(weight)
    (lo, hi), = array_ranges([weight])
    cut = -(-lo // HUGE_PAGE) * HUGE_PAGE + 5 * MiB + 4096
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.madvise(cut, 4096, 15) == 0          # MADV_NOHUGEPAGE

    report = back_with_huge_pages([(lo, hi)])

    np.testing.assert_array_equal(np.array(weight), expected)
    if _thp_mode() == "never" or any("EINVAL" in e for e in report.errors):
        pytest.skip(f"no transparent huge pages here ({_thp_mode()}, {report.errors})")
    assert report.errors == ()
    whole_pages = (hi // HUGE_PAGE - -(-lo // HUGE_PAGE)) * HUGE_PAGE
    assert report.weights_collapsed == whole_pages     # the page across the cut too
    assert _huge_bytes(lo, hi) >= whole_pages


def test_array_ranges_skips_empty_arrays():
    a, empty = mx.ones((1000,), dtype=mx.float32), mx.zeros((0,), dtype=mx.float32)
    mx.eval(a, empty)
    ((lo, hi),) = array_ranges([a, empty])
    assert hi - lo == 4000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux madvise")
def test_zeros_on_huge_pages_commits_huge_zero_pages_now_and_writes_stick():
    cache = mx.full((12 * MiB // 2,), 1.0, dtype=mx.float16)   # ones: to see them dropped
    mx.eval(cache)
    (lo, hi), = array_ranges([cache])

    moved = zeros_on_huge_pages([(lo, hi)])

    if _thp_mode() == "never":
        assert moved == 0
        pytest.skip("no transparent huge pages here")
    whole_pages = (hi // HUGE_PAGE - -(-lo // HUGE_PAGE)) * HUGE_PAGE
    assert moved == whole_pages > 0
    # Resident now, on huge pages, before anything writes them: serving never commits
    # more of the cache than it holds at startup.
    assert _huge_bytes(lo, hi, "Rss") >= whole_pages
    assert _huge_bytes(lo, hi) >= whole_pages
    values = np.array(cache)
    page_lo, page_hi = (-(-lo // HUGE_PAGE) * HUGE_PAGE - lo) // 2, (hi // HUGE_PAGE * HUGE_PAGE - lo) // 2
    assert not values[page_lo:page_hi].any()   # the moved pages read as zeros
    # A write through an MLX kernel in place (as the KV writes are) lands and is read back.
    from vllm_metal import ops

    rows = mx.full((3, 1, 4), 2.5, dtype=mx.float16)
    view = cache.reshape(-1, 1, 1, 4)
    targets = [page_lo // 4, page_lo // 4 + (1 << 18), page_hi // 4 - 1]
    k, _ = ops.reshape_and_cache(rows, rows, view, view, mx.array(targets, dtype=mx.int32))
    mx.eval(k)
    got = np.array(k).reshape(-1, 4)
    assert (got[targets] == 2.5).all()
    assert np.count_nonzero(got[page_lo // 4:page_hi // 4]) == 12
