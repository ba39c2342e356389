"""The docs sections, the tables and the plots, rendered from a synthetic history record."""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks.run_suite as run_suite
from benchmarks.suite import history, run
from benchmarks.suite.install import DEFAULT_CACHE_ROOT
from benchmarks.suite.plots import series
from benchmarks.suite.report import HOW_TO_RUN, SERVING, replace_section, update_docs
from benchmarks.suite.servers import SERVERS
from benchmarks.suite.tables import OTHER_CPU_FLAG_PCT, summary_table

REPO = Path(__file__).resolve().parents[3]
BYTES_PER_TOKEN = 96_600_000
READ_GBPS = 35.0


def level(c, n, asked, tok_s, ttft_ms, tpot_ms, other=2.0, **extra):
    return {"concurrency": c, "num_prompts": n, "requested": asked, "capped": n < asked,
            "completed": n, "failed": 0, "output_tok_s": tok_s, "median_ttft_ms": ttft_ms,
            "median_tpot_ms": tpot_ms, "output_len_min": 120, "output_len_median": 128,
            "output_len_max": 128, "server_cpu_pct": 90.0, "client_cpu_pct": 6.0,
            "other_cpu_pct": other, "wall_s": 60.0, "status": "ok",
            "command": f"vllm bench serve --max-concurrency {c} --num-prompts {n}", **extra}


def synthetic_record() -> dict:
    return {
        "timestamp": "2026-11-30T10:05:00+00:00", "git_commit": "0123456789abcdef0123",
        "git_dirty": False, "duration_s": 2880,
        "command": "benchmarks/run_suite.py --time-cap 180",
        "host": {"cores": 2, "machine": "x86_64", "python": "3.11.2",
                 "loadavg_start": [0.31, 0.5, 0.6], "loadavg_end": [1.42, 1.2, 1.0],
                 "env": {"VLLM_METAL_CPU_THREADS": "2"}},
        "workload": {"input_len": 256, "output_len": 128, "levels": [1, 4, 16],
                     "requests": [8, 16, 48], "time_cap_s": 180.0, "model": "m.gguf"},
        "servers": [
            {"server": "ours", "label": "vllm-metal (ours)", "status": "ok", "startup_s": 16.0,
             "cpu_busy_before_pct": 3.0, "quiet": True, "quiet_wait_s": 3.0,
             "loadavg_before": [0.2, 0.3, 0.4], "loadavg_after": [1.9, 1.0, 0.7],
             "probe": {"ttft_s": 0.31, "tpot_s": 0.021},
             "launch": "vllm-metal serve m.gguf --port 1234", "env": {},
             "levels": [level(1, 8, 8, 45.5, 310.0, 20.0), level(4, 16, 16, 90.0, 500.0, 40.0),
                        level(16, 48, 48, 150.0, 1900.0, 90.0)]},
            {"server": "mlx_lm.server", "label": "mlx_lm.server 0.32", "status": "ok",
             "startup_s": 1.0, "cpu_busy_before_pct": 40.0, "quiet": False,
             "quiet_wait_s": 30.0, "loadavg_before": [0.8, 0.5, 0.4],
             "loadavg_after": [1.1, 0.9, 0.8], "probe": {"ttft_s": 24.7, "tpot_s": 0.133},
             "launch": "mlx_lm.server --port 1235",
             "levels": [level(1, 4, 8, 3.04, 24700.0, 133.0),
                        level(4, 4, 16, 3.11, 60000.0, 200.0),
                        level(16, 16, 48, 2.99, 285000.0, 2900.0, other=25.0)]},
            {"server": "llama-server", "label": "llama.cpp llama-server", "levels": [],
             "status": "failed to start: exited with 1", "loadavg_before": [0.5, 0.5, 0.5],
             "loadavg_after": [0.4, 0.5, 0.5]},
            {"server": "vllm-mlx", "label": "vllm-mlx 0.6.0", "status": "ok",
             "loadavg_before": [0.6, 0.5, 0.5], "loadavg_after": [1.0, 0.5, 0.5],
             "levels": [level(1, 1, 8, 3.0, 25000.0, 130.0),
                        {"concurrency": 16, "num_prompts": 0, "requested": 48, "capped": True,
                         "status": "skipped: 9000 s estimated for one wave"}]},
        ],
        "machine": {"read_gbps_1t": 18.4, "read_gbps_2t": READ_GBPS, "read_gbps_best": READ_GBPS,
                    "matmul_fp32_gflops_1t": 225.0, "matmul_fp32_gflops_2t": 445.0,
                    "blas": [{"internal_api": "openblas", "version": "0.3.31",
                              "architecture": "SkylakeX", "num_threads": 2}],
                    "numpy": "2.4.6", "weight_bytes_per_token": BYTES_PER_TOKEN,
                    "decode_bound_tok_s": READ_GBPS * 1e9 / BYTES_PER_TOKEN, "runs": 2},
    }


EXISTING = ("# Benchmarks\n\nIntro.\n\n## First look\nbaseline\n\n" + SERVING
            + "\nold serving table\n\n## CPU kernels\nkernel table\n\n" + HOW_TO_RUN
            + "\nold how-to\n")


def rendered(tmp_path: Path) -> str:
    docs = tmp_path / "benchmarks.md"
    docs.write_text(EXISTING)
    update_docs(docs, synthetic_record(), list(SERVERS))
    return docs.read_text()


def row_of(text: str, first_cell: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {first_cell} |"))


def test_section_states_the_single_command_commit_and_run_time(tmp_path):
    text = rendered(tmp_path)
    assert "`.venv/bin/python benchmarks/run_suite.py --time-cap 180`" in text
    assert "`0123456789ab`" in text and "took 48 min" in text
    assert "`VLLM_METAL_CPU_THREADS=2`" in text


def test_section_states_machine_limits_and_our_fraction_of_the_bound(tmp_path):
    text = rendered(tmp_path)
    assert "18.4 GB/s with 1 thread, 35.0 GB/s with 2" in text
    assert "225 / 445 GFLOP/s" in text
    bound = READ_GBPS * 1e9 / BYTES_PER_TOKEN
    assert f"= {bound:.0f} tok/s" in text
    decode = 1000.0 / 20.0   # ours' median TPOT at c=1 is 20 ms
    assert f"{decode:.1f} tok/s decode" in text
    assert f"{100 * decode / bound:.1f}% of the bound" in text
    assert f"{100 * 45.5 / bound:.1f}%." in text
    # Only our servers are held against the bound.
    assert "mlx_lm.server, single stream" not in text


def test_section_gives_load_average_before_and_after_each_server(tmp_path):
    text = rendered(tmp_path)
    assert "0.31 at the start and 1.42 at the end" in text
    table = text[text.index("| server | startup (s)"):]
    assert "| 0.20 / 1.90 |" in row_of(table, "ours")
    assert "| 0.80 / 1.10 |" in row_of(table, "mlx_lm.server")
    assert "40% (not quiet after 30 s)" in row_of(table, "mlx_lm.server")
    assert "0.31 / 21.0" in row_of(table, "ours")   # probe TTFT s / TPOT ms


def test_summary_marks_capped_and_busy_levels_and_nothing_else(tmp_path):
    record = synthetic_record()
    table = summary_table(record)
    ours = row_of(table, "vllm-metal (ours)")
    assert "*" not in ours and "†" not in ours
    assert ours.split(" | ")[1:4] == ["45.5", "90.0", "150.0"]
    mlx = row_of(table, "mlx_lm.server 0.32").split(" | ")
    assert mlx[1:4] == ["3.0 *", "3.1 *", "3.0 *†"]
    assert mlx[4] == "285.00 s |"
    assert "| failed | failed | failed |" in row_of(table, "llama.cpp llama-server")
    vllm_mlx = row_of(table, "vllm-mlx 0.6.0").split(" | ")
    assert vllm_mlx[1:4] == ["3.0 *", "-", "skipped"]
    text = rendered(tmp_path)
    assert "cap of 180 s" in text and "at least one full wave" in text
    assert f"more than {OTHER_CPU_FLAG_PCT:.0f}% of the machine's CPU" in text
    assert "(4 of 8, time cap)" in text and "(48 of 48)" in text


def test_update_keeps_the_other_sections_in_place(tmp_path):
    text = rendered(tmp_path)
    assert "old serving table" not in text and "old how-to" not in text
    for kept in ("Intro.", "baseline", "kernel table"):
        assert kept in text
    assert (text.index("## First look") < text.index(SERVING) < text.index("## CPU kernels")
            < text.index(HOW_TO_RUN))
    how = text[text.index(HOW_TO_RUN):]
    assert "vllm-metal serve m.gguf --port 1234" in how
    assert "vllm bench serve --max-concurrency 1 --num-prompts 8" in how
    assert all(name in how for name in SERVERS)


def test_replace_section_appends_when_missing():
    out = replace_section("# Benchmarks\n\n## Kernels\nk1\n", SERVING, SERVING + "\nbody\n")
    assert out.endswith(SERVING + "\nbody\n") and "k1" in out


def test_portable_writes_repo_and_home_relative(tmp_path):
    repo, home = tmp_path / "home" / "me" / "repo", tmp_path / "home" / "me"
    record = {"launch": f"{repo}/.venv/bin/vllm serve {home}/.cache/x/m.gguf", "cwd": str(repo)}
    out = history.portable(record, repo, home)
    assert out == {"launch": ".venv/bin/vllm serve ~/.cache/x/m.gguf", "cwd": "."}


def test_render_only_rewrites_the_docs_from_the_last_history_record(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(run, "draw_plots", lambda root, record, out: drawn.append((record, out)))
    hist, docs = tmp_path / "history.jsonl", tmp_path / "docs" / "benchmarks.md"
    older = {**synthetic_record(), "command": "benchmarks/run_suite.py --levels 1"}
    history.append_history(hist, older)
    history.append_history(hist, synthetic_record())
    argv = ["--render-only", "--history", str(hist), "--docs", str(docs),
            "--cache-root", str(tmp_path / "cache")]
    assert run_suite.main(argv) == 0
    text = docs.read_text()
    assert "run_suite.py --time-cap 180`" in text and "--levels 1`" not in text
    assert len(drawn) == 1 and drawn[0][1] == docs.parent / "img"
    assert drawn[0][0]["command"] == "benchmarks/run_suite.py --time-cap 180"


def test_render_only_without_history_names_the_file(tmp_path):
    hist = tmp_path / "none.jsonl"
    with pytest.raises(SystemExit, match="none.jsonl"):
        run_suite.main(["--render-only", "--history", str(hist), "--docs",
                        str(tmp_path / "d.md")])


def test_plot_series_keep_completed_levels_and_flag_capped_ones():
    s = series(synthetic_record(), "median_ttft_ms", 1e-3)
    assert s["ours"] == [(1, pytest.approx(0.31), False), (4, pytest.approx(0.5), False),
                         (16, pytest.approx(1.9), False)]
    assert s["mlx_lm.server"][2] == (16, pytest.approx(285.0), True)
    assert s["vllm-mlx"] == [(1, pytest.approx(25.0), True)]   # the skipped level: no point
    assert "llama-server" not in s


def python_with_matplotlib() -> str | None:
    tools = DEFAULT_CACHE_ROOT.expanduser() / "tools" / "venv" / "bin" / "python"
    for python in (sys.executable, str(tools)):
        if os.path.exists(python) and subprocess.run(
                [python, "-c", "import matplotlib"], capture_output=True).returncode == 0:
            return python
    return None


def test_plots_are_drawn_as_png_files(tmp_path):
    python = python_with_matplotlib()
    if python is None:
        pytest.skip("no interpreter with matplotlib (the suite's tools venv is not installed)")
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps(synthetic_record()))
    subprocess.run([python, "-m", "benchmarks.suite.plots", str(run_json), str(tmp_path / "img")],
                   cwd=REPO, check=True, timeout=120)
    for name in ("serving_throughput.png", "serving_ttft.png"):
        head = (tmp_path / "img" / name).read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", head[16:24]) == (770, 495)   # 7 x 4.5 in at 110 dpi
