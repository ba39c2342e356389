"""The machine limits' arithmetic: read bandwidth and the single-stream decode bound.

    .venv/bin/python -m pytest -q benchmarks/suite/tests
"""

import numpy as np
import pytest

from benchmarks.suite import machine


def test_read_bandwidth_is_bytes_over_the_median_sweep(monkeypatch):
    """Sweeps of 1, 2 and 4 s over 8000 bytes: the median (2 s) gives 4000 B/s; each
    sweep reads the data once, as a maximum over uint64 words."""
    data = np.ones(1000, dtype=np.float64)
    clock = iter([0.0, 1.0, 10.0, 12.0, 20.0, 24.0])
    seen = []
    monkeypatch.setattr(machine.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(machine.np, "max", lambda part: seen.append(part.dtype) or part[0])
    assert machine.read_bandwidth(1, data, repeats=3) == pytest.approx(4000 / 1e9)
    assert seen == [np.dtype(np.uint64)] * 3


def test_read_bandwidth_reads_a_real_array():
    assert machine.read_bandwidth(2, np.ones(1 << 20, dtype=np.float64), repeats=3) > 0


def test_the_bound_takes_the_faster_thread_count():
    limits = {"read_gbps_1t": 20.0, "read_gbps_2t": 16.0, "weight_bytes_per_token": 4 * 10**9}
    bound = machine.with_bound(limits)
    assert bound["read_gbps_best"] == 20.0
    assert bound["decode_bound_tok_s"] == pytest.approx(5.0)
