"""Run the suite: machine limits, then each server alone through every level, then the report."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from benchmarks.suite import client, report
from benchmarks.suite.install import InstallError, ensure_tools_venv
from benchmarks.suite.machine import best_of
from benchmarks.suite.models import model_files
from benchmarks.suite.plan import plan_level
from benchmarks.suite.process import ServerProcess, ServerStartError, free_port
from benchmarks.suite.servers import SERVERS
from benchmarks.suite.servers.base import ModelFiles, Server

REPO = Path(__file__).resolve().parents[2]


@dataclass
class SuiteConfig:
    servers: list[str]
    levels: list[int]
    requests: list[int]
    time_cap_s: float | None
    cache_root: Path
    gguf: Path
    ours_args: str
    history: Path
    docs: Path | None
    argv: list[str]


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def measure_machine(cache_root: Path, gguf: Path) -> dict:
    """Machine limits from the tools venv, OpenBLAS core-type overrides removed for it alone."""
    try:
        python = ensure_tools_venv(cache_root)
        env = {k: v for k, v in os.environ.items()
               if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
        out = subprocess.run([str(python), "-m", "benchmarks.suite.machine", str(gguf)], cwd=REPO,
                             env=env, capture_output=True, text=True, check=True, timeout=900)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (InstallError, subprocess.SubprocessError, ValueError, IndexError) as e:
        return {"error": f"{type(e).__name__}: {str(e)[-300:]}"}


def run_server(server: Server, models: ModelFiles, cfg: SuiteConfig, work: Path) -> dict:
    """One server through every level. Failures become the record's status, never an exception."""
    rec = {"server": server.name, "label": server.label, "status": "ok", "levels": [],
           "loadavg_before": os.getloadavg()}
    print(f"== {server.name}", flush=True)
    try:
        begin = time.monotonic()
        server.install()
        rec["install_s"] = round(time.monotonic() - begin, 1)
    except Exception as e:   # any install failure is reported in the table, the suite goes on
        rec["status"] = f"install failed: {e}"
        return rec
    proc = None
    try:
        port = free_port()
        launch = server.launch(models, port)
        rec["launch"] = shlex.join(launch.argv)
        proc = ServerProcess(launch, port, work / f"server-{server.name}.log")
        rec["startup_s"] = round(proc.start(server.startup_timeout), 1)
        pace = client.probe_seconds_per_token(proc.base_url, launch)
        rec["probe_s_per_token"] = pace
        best_tok_s = 1.0 / pace if pace else None
        measured = None
        for c, asked in zip(cfg.levels, cfg.requests):
            plan = plan_level(c, asked, client.OUTPUT_LEN, best_tok_s, cfg.time_cap_s)
            level = client.Level(c, plan.num_prompts, client.level_seed(c))
            if plan.skip:
                row = {"concurrency": c, "num_prompts": 0, "requested": asked, "capped": True,
                       "status": f"skipped: {plan.estimate_s:.0f}s estimated for {plan.num_prompts} "
                                 f"requests, over twice the {cfg.time_cap_s:.0f}s cap"}
            else:
                timeout = (2 * max(cfg.time_cap_s, plan.estimate_s or 0) + 300
                           if cfg.time_cap_s else None)
                row = client.run_level(proc.base_url, launch, models.tokenizer_dir, level, work,
                                       timeout, tag=server.name)
                row["requested"] = asked
                row["capped"] = plan.num_prompts < asked
                if row.get("output_tok_s"):
                    # A measured level replaces the probe: the probe has no long prompt to prefill.
                    measured = max(measured or 0, row["output_tok_s"])
                    best_tok_s = measured
            print(f"   c={c}: {row.get('status')} {row.get('output_tok_s')}", flush=True)
            rec["levels"].append(row)
    except ServerStartError as e:
        rec["status"] = f"failed to start: {e}"
    except Exception as e:
        rec["status"] = f"error: {type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        if proc is not None:
            proc.stop()
        server.after_stop()
        rec["loadavg_after"] = os.getloadavg()
    return rec


def bound_fraction(record: dict) -> dict | None:
    """Our single-stream decode against the bandwidth bound, from the c=1 level."""
    bound = (record.get("machine") or {}).get("decode_bound_tok_s")
    ours = next((s for s in record["servers"] if s["server"] == "ours"), None)
    row = next((r for r in (ours or {}).get("levels", []) if r["concurrency"] == 1), None)
    if not bound or not row or not row.get("median_tpot_ms"):
        return None
    decode = 1000.0 / row["median_tpot_ms"]
    return {"decode_tok_s": decode, "decode_fraction": decode / bound,
            "output_tok_s": row["output_tok_s"], "output_fraction": row["output_tok_s"] / bound}


def make_servers(cfg: SuiteConfig) -> list[Server]:
    out = []
    for name in cfg.servers:
        cls = SERVERS[name]
        out.append(cls(cfg.cache_root, cfg.ours_args) if name == "ours" else cls(cfg.cache_root))
    return out


def run_suite(cfg: SuiteConfig) -> dict:
    cfg.cache_root.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.timezone.utc)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    work = cfg.cache_root / "runs" / stamp
    work.mkdir(parents=True, exist_ok=True)
    record = {
        "timestamp": started.isoformat(timespec="seconds"),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "command": shlex.join(["benchmarks/run_suite.py", *cfg.argv]),
        "host": {"cores": os.cpu_count(), "machine": platform.machine(),
                 "python": platform.python_version(), "loadavg_start": os.getloadavg()},
        "workload": {"input_len": client.INPUT_LEN, "output_len": client.OUTPUT_LEN,
                     "levels": cfg.levels, "requests": cfg.requests, "time_cap_s": cfg.time_cap_s,
                     "model": cfg.gguf.name},
    }
    print(f"work dir {work}", flush=True)
    servers = make_servers(cfg)
    print("measuring machine limits", flush=True)
    limit_runs = [measure_machine(cfg.cache_root, cfg.gguf)]
    models = model_files(cfg.gguf, cfg.cache_root, any(s.needs_mlx_model for s in servers))
    record["servers"] = [run_server(s, models, cfg, work) for s in servers]
    # Measured again at the end: the machine is shared, each limit keeps its best.
    limit_runs.append(measure_machine(cfg.cache_root, cfg.gguf))
    record["machine"] = best_of(limit_runs)
    record["machine_runs"] = limit_runs
    record["ours_vs_bound"] = bound_fraction(record)
    record["host"]["loadavg_end"] = os.getloadavg()
    record["duration_s"] = round((dt.datetime.now(dt.timezone.utc) - started).total_seconds())
    record["work_dir"] = str(work)
    record = report.portable(record, REPO, Path.home())
    report.append_history(cfg.history, record)
    if cfg.docs is not None:
        render(cfg, record)
    return record


def render(cfg: SuiteConfig, record: dict) -> None:
    """Rewrite our docs sections and the plots from one history record."""
    report.update_docs(cfg.docs, record)
    run_json = cfg.cache_root / "runs" / "render.json"
    run_json.parent.mkdir(parents=True, exist_ok=True)
    run_json.write_text(json.dumps(record))
    try:
        python = ensure_tools_venv(cfg.cache_root)
        subprocess.run([str(python), "-m", "benchmarks.suite.plots", str(run_json),
                        str(cfg.docs.parent / "img")], cwd=REPO, check=True, timeout=300)
    except (InstallError, subprocess.SubprocessError) as e:
        print(f"plots not drawn: {e}", file=sys.stderr)
