"""The machine limits' arithmetic: read bandwidth and the single-stream decode bound.

    .venv/bin/python -m pytest -q benchmarks/suite/tests
"""

import numpy as np
import pytest

from benchmarks.suite import machine, tables


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


@pytest.mark.parametrize("method, said",
                         [("max", "numpy max over 2 GiB"), (None, "numpy sum over 2 GiB")])
def test_the_report_names_the_read_of_its_own_record(method, said):
    """A record from before the maximum (no read_method) read with numpy's sum."""
    m = {"read_gbps_1t": 14.0, "read_gbps_2t": 28.0, "matmul_fp32_gflops_1t": 150.0,
         "matmul_fp32_gflops_2t": 300.0, "blas": [], "numpy": "2", "weight_bytes_per_token": 10**8,
         "decode_bound_tok_s": 280.0}
    if method:
        m["read_method"] = method
    assert said in "\n".join(tables.machine_lines({"machine": m, "servers": []}))


def test_a_measured_record_says_how_it_read():
    assert machine.READ_METHOD == "max"
    assert machine.best_of([{"read_gbps_1t": 1.0, "read_gbps_2t": 2.0, "matmul_fp32_gflops_1t": 1.0,
                             "matmul_fp32_gflops_2t": 1.0, "weight_bytes_per_token": 10,
                             "read_method": machine.READ_METHOD}])["read_method"] == "max"
