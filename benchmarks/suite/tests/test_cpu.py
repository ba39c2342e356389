"""CPU accounting: a process group's CPU seconds and the shares of a window."""

import subprocess
import sys

import pytest

from benchmarks.suite import cpu
from benchmarks.suite.process import group_members

SPINNER = """
import sys, time
while time.process_time() < float(sys.argv[1]):
    pass
print(time.process_time(), flush=True)
time.sleep(60)
"""


def test_shares_split_the_window_between_server_client_and_others():
    before = cpu.CpuSample(machine_busy_s=100.0, machine_total_s=400.0, server_s=10.0, suite_s=5.0)
    after = cpu.CpuSample(machine_busy_s=130.0, machine_total_s=440.0, server_s=30.0, suite_s=9.0)
    # 40 s of machine time: server 20, client 4, the rest of the 30 busy seconds is others'.
    assert cpu.shares(before, after) == {"server_cpu_pct": 50.0, "client_cpu_pct": 10.0,
                                         "other_cpu_pct": 15.0}


def test_shares_never_report_negative_other_time():
    before = cpu.CpuSample(100.0, 400.0, 10.0, 5.0)
    # Per-process clocks can run a tick ahead of the machine's: others' share clamps at 0.
    after = cpu.CpuSample(110.0, 420.0, 21.0, 5.0)
    assert cpu.shares(before, after)["other_cpu_pct"] == 0.0
    assert cpu.shares(before, before) == {}


def test_group_cpu_seconds_match_what_the_group_itself_used():
    proc = subprocess.Popen([sys.executable, "-c", SPINNER, "0.4"], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        used = float(proc.stdout.readline())   # the spinner's own CPU clock, once it is done
        assert group_members(proc.pid) == [proc.pid]
        measured = cpu.group_cpu_s(proc.pid)
        assert measured == pytest.approx(used, abs=0.05)
        assert used >= 0.4
        assert cpu.group_cpu_s(None) == 0.0
    finally:
        proc.kill()
        proc.wait()
    assert group_members(proc.pid) == []


def test_machine_times_are_cumulative_and_busy_within_total():
    busy1, total1 = cpu.machine_times()
    busy2, total2 = cpu.machine_times()
    assert 0 <= busy1 <= total1 and busy2 >= busy1 and total2 >= total1


def test_wait_until_quiet_reports_what_it_saw():
    seen = cpu.wait_until_quiet(busy_below_pct=100.0, window_s=0.2, max_wait_s=0.0)
    assert set(seen) == {"cpu_busy_before_pct", "quiet_wait_s", "quiet"}
    assert seen["quiet"] == (seen["cpu_busy_before_pct"] < 100.0)
    with pytest.raises(ValueError, match="busy_below_pct"):
        cpu.wait_until_quiet(busy_below_pct=0.0)
