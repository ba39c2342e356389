"""Back the weights and the KV cache with transparent huge pages (Linux CPU backend).

A decode step streams every weight byte from DRAM once. MLX allocates arrays
with malloc, so the weights sit on 4 KiB pages: a TLB miss for every 4 KiB read,
and the cores' stream prefetchers stop at each page edge. numpy, whose reads set
the bandwidth the benchmarks hold us to, asks for huge pages on large arrays.
Here the same is done for the weights once they are loaded: the 2 MiB-aligned
part of each memory mapping that holds weights is advised ``MADV_HUGEPAGE`` and
collapsed at once (``MADV_COLLAPSE``, Linux 6.1+) rather than whenever
khugepaged gets to it. The KV cache, all zeros when it is made, is instead
dropped and faulted straight back in as zeroed huge pages
(``zeros_on_huge_pages``). Where the kernel refuses (THP off, an older kernel),
memory simply stays on small pages.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import sys
from collections.abc import Iterable
from dataclasses import dataclass

HUGE_PAGE = 2 << 20        # x86_64 and aarch64 (4 KiB base pages) PMD size
MADV_DONTNEED = 4
MADV_HUGEPAGE = 14
MADV_POPULATE_WRITE = 23  # Linux 5.14+
MADV_COLLAPSE = 25


@dataclass(frozen=True)
class HugePageReport:
    weight_bytes: int          # bytes of the arrays asked about
    collapsed_bytes: int       # bytes of the spans MADV_COLLAPSE moved onto huge pages
    weights_collapsed: int     # weight bytes inside the collapsed spans
    errors: tuple[str, ...]    # one "call: ERRNO" per refused span, e.g. "collapse: EINVAL"


def anonymous_mappings(maps: str) -> list[tuple[int, int]]:
    """[start, end) of the private writable anonymous mappings (and the heap) in the text
    of /proc/<pid>/maps; huge pages can back only these."""
    spans = []
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[1] != "rw-p":
            continue
        name = fields[5] if len(fields) > 5 else ""
        if name not in ("", "[heap]"):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        spans.append((start, end))
    return spans


def plan_spans(ranges: Iterable[tuple[int, int]], mappings: Iterable[tuple[int, int]],
               page: int = HUGE_PAGE) -> list[tuple[int, int]]:
    """Page-aligned spans to advise: per mapping (touching mappings count as one), from
    the first weight byte in it to the last, cut to the mapping and shrunk to whole
    ``page``s; empty ones dropped.

    ``ranges`` are [start, end) byte ranges of weights; ``mappings`` must not overlap.
    Memory between two weights of one mapping comes along: malloc interleaves small
    allocations with them, and spans of single weights (most are under 2 MiB) would
    hold no aligned page.
    """
    mappings = _touching_merged(mappings)
    ends = [e for _, e in mappings]
    hull: dict[int, list[int]] = {}   # mapping index -> [first weight byte, last + 1]
    for s, e in ranges:
        i = bisect.bisect_right(ends, s)   # the first mapping ending after s
        while i < len(mappings) and mappings[i][0] < e:
            m_start, m_end = mappings[i]
            lo, hi = max(s, m_start), min(e, m_end)
            span = hull.setdefault(i, [lo, hi])
            span[0], span[1] = min(span[0], lo), max(span[1], hi)
            i += 1
    spans = [_whole_pages(*hull[i], page) for i in sorted(hull)]
    return [(lo, hi) for lo, hi in spans if hi > lo]


def _touching_merged(mappings: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted mappings with each run of touching ones (end == next start) made one.

    Earlier advice splits one malloc region into several mappings at boundaries that need
    not be page-aligned; a huge page across such a boundary would be lost on both sides.
    One MADV_HUGEPAGE over the whole run gives its parts the same flags, so the kernel
    merges them back and the collapse can use that page.
    """
    merged: list[list[int]] = []
    for start, end in sorted(mappings):
        if merged and merged[-1][1] == start:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _whole_pages(start: int, end: int, page: int = HUGE_PAGE) -> tuple[int, int]:
    """[start, end) shrunk to whole ``page``s (empty when it holds none: hi <= lo)."""
    return -(-start // page) * page, end // page * page


def _madvise():
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _last_error() -> str:
    return errno.errorcode.get(ctypes.get_errno(), "?")


def back_with_huge_pages(ranges: list[tuple[int, int]]) -> HugePageReport:
    """Advise and collapse the huge-page spans around ``ranges`` ([start, end) of weight
    bytes, in this process). Linux only; elsewhere it reports doing nothing."""
    weight_bytes = sum(e - s for s, e in ranges)
    if not sys.platform.startswith("linux"):
        return HugePageReport(weight_bytes, 0, 0, ("not Linux",))
    try:
        with open("/proc/self/maps") as f:
            spans = plan_spans(ranges, anonymous_mappings(f.read()))
    except OSError as e:
        return HugePageReport(weight_bytes, 0, 0, (f"maps: {e.strerror}",))
    madvise = _madvise()
    collapsed, errors = [], []
    for lo, hi in spans:
        if madvise(lo, hi - lo, MADV_HUGEPAGE) != 0:
            errors.append(f"advise: {_last_error()}")
        elif madvise(lo, hi - lo, MADV_COLLAPSE) != 0:
            errors.append(f"collapse: {_last_error()}")
        else:
            collapsed.append((lo, hi))
    inside = sum(max(0, min(e, hi) - max(s, lo)) for s, e in ranges for lo, hi in collapsed)
    return HugePageReport(weight_bytes, sum(hi - lo for lo, hi in collapsed), inside,
                          tuple(errors))


def zeros_on_huge_pages(ranges: list[tuple[int, int]]) -> int:
    """For freshly zeroed buffers no one reads yet (the KV cache): advise the whole 2 MiB
    pages inside each of ``ranges`` MADV_HUGEPAGE, drop them (MADV_DONTNEED) and fault
    them straight back in as zeroed huge pages (MADV_POPULATE_WRITE; where the kernel
    lacks it, by writing the zeros again). A collapse would cost seconds for GiBs.

    The pages are committed here rather than on first write because vLLM's block
    allocator hands out the least recently freed block: a lazily committed pool grows
    the process by every block's first write until all of it has been written (hours of
    serving at 4 GiB), and a host short of memory would then fail mid-serving instead
    of at startup.

    Returns the bytes moved; pages whose advice the kernel refuses keep their zeros.
    Raises MemoryError when the kernel cannot back the pages (ENOMEM).
    """
    if not sys.platform.startswith("linux"):
        return 0
    madvise = _madvise()
    moved = 0
    for start, end in ranges:
        lo, hi = _whole_pages(start, end)
        if hi <= lo or madvise(lo, hi - lo, MADV_HUGEPAGE) != 0 \
                or madvise(lo, hi - lo, MADV_DONTNEED) != 0:
            continue
        if madvise(lo, hi - lo, MADV_POPULATE_WRITE) != 0:
            if ctypes.get_errno() == errno.ENOMEM:
                raise MemoryError(f"the kernel could not back {(hi - lo) / 2**20:.0f} MiB "
                                  "of zeroed memory (MADV_POPULATE_WRITE: ENOMEM)")
            ctypes.memset(lo, 0, hi - lo)
        moved += hi - lo
    return moved


def array_ranges(arrays: Iterable) -> list[tuple[int, int]]:
    """[start, end) of each evaluated mx.array's bytes (empty arrays skipped)."""
    from vllm_metal.native import get_ops

    address = get_ops().data_ptr
    return [(address(a), address(a) + a.nbytes) for a in arrays if a.nbytes]
