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
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.suite import client, cpu, history, report
from benchmarks.suite.install import InstallError, ensure_tools_venv
from benchmarks.suite.machine import best_of
from benchmarks.suite.models import model_files
from benchmarks.suite.plan import plan_level
from benchmarks.suite.probe import warm_up_and_probe
from benchmarks.suite.process import ServerProcess, ServerStartError, free_port
from benchmarks.suite.servers import SERVERS
from benchmarks.suite.servers.base import Launch, ModelFiles, Server
from benchmarks.suite.servers.ours import Ours
from benchmarks.suite.tables import bound_fractions

REPO = Path(__file__).resolve().parents[2]
# Variables that change what a server or the limits measure; recorded with every run.
RECORDED_ENV_PREFIXES = ("VLLM_", "OMP_", "OPENBLAS_", "MKL_", "MLX_")


@dataclass
class SuiteConfig:
    servers: list[str]
    levels: list[int]
    requests: list[int]
    time_cap_s: float | None
    cache_root: Path
    gguf: Path | None
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


def run_levels(server: Server, proc: ServerProcess, launch: Launch, models: ModelFiles,
               cfg: SuiteConfig, work: Path, rec: dict) -> None:
    """Every level in turn, each sized to the cap from the best pace seen so far."""
    pace = warm_up_and_probe(proc.base_url, launch, client.INPUT_LEN)
    rec["probe"] = asdict(pace) if pace else None
    if pace is None:
        print("   probe failed: the first level runs as asked", flush=True)
    request_s = pace.request_s(client.OUTPUT_LEN) if pace else None
    measured = None
    for c, asked in zip(cfg.levels, cfg.requests):
        plan = plan_level(c, asked, request_s, cfg.time_cap_s)
        if plan.skip:
            row = {"concurrency": c, "num_prompts": 0, "requested": asked, "capped": True,
                   "status": f"skipped: {plan.estimate_s:.0f} s estimated for one wave of "
                             f"{plan.num_prompts} requests, over the cap of "
                             f"{cfg.time_cap_s:.0f} s many times"}
        else:
            timeout = (2 * max(cfg.time_cap_s, plan.estimate_s or 0) + 300
                       if cfg.time_cap_s else None)
            level = client.Level(c, plan.num_prompts, client.level_seed(c))
            before = cpu.sample(proc.proc.pid)
            row = client.run_level(proc.base_url, launch, models.tokenizer_dir, level, work,
                                   timeout, tag=server.name)
            row.update(cpu.shares(before, cpu.sample(proc.proc.pid)))
            row["requested"] = asked
            row["capped"] = plan.num_prompts < asked
            row["estimate_s"] = None if plan.estimate_s is None else round(plan.estimate_s, 1)
            if row.get("completed") and row.get("duration_s"):
                # A measured level replaces the probe: the probe ran alone on the server.
                per_request = row["duration_s"] / row["num_prompts"]
                measured = min(measured or per_request, per_request)
                request_s = measured
        print(f"   c={c}: {row.get('status')} {row.get('output_tok_s')} "
              f"({row.get('num_prompts')} of {asked} requests, {row.get('wall_s')} s, "
              f"other CPU {row.get('other_cpu_pct')}%)", flush=True)
        rec["levels"].append(row)


def run_server(server: Server, models: ModelFiles, cfg: SuiteConfig, work: Path) -> dict:
    """One server through every level. Failures become the record's status, never an exception."""
    rec = {"server": server.name, "label": server.label, "status": "ok", "levels": []}
    print(f"== {server.name}", flush=True)
    try:
        begin = time.monotonic()
        server.install()
        rec["install_s"] = round(time.monotonic() - begin, 1)
    except Exception as e:   # any install failure is reported in the table, the suite goes on
        rec["status"] = f"install failed: {e}"
        return rec
    rec.update(cpu.wait_until_quiet())
    rec["loadavg_before"] = os.getloadavg()
    proc = None
    try:
        port = free_port()
        launch = server.launch(models, port)
        rec["launch"] = shlex.join(launch.argv)
        rec["env"] = dict(launch.env)
        proc = ServerProcess(launch, port, work / f"server-{server.name}.log")
        rec["startup_s"] = round(proc.start(server.startup_timeout), 1)
        run_levels(server, proc, launch, models, cfg, work, rec)
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


def make_servers(cfg: SuiteConfig) -> list[Server]:
    out = []
    for name in cfg.servers:
        cls = SERVERS[name]
        out.append(cls(cfg.cache_root, cfg.ours_args) if issubclass(cls, Ours)
                   else cls(cfg.cache_root))
    return out


def run_suite(cfg: SuiteConfig) -> dict:
    cfg.cache_root.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.timezone.utc)
    begin = time.monotonic()
    work = cfg.cache_root / "runs" / started.strftime("%Y%m%dT%H%M%SZ")
    work.mkdir(parents=True, exist_ok=True)
    record = {
        "timestamp": started.isoformat(timespec="seconds"),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "command": shlex.join(["benchmarks/run_suite.py", *cfg.argv]),
        "host": {"cores": os.cpu_count(), "machine": platform.machine(),
                 "python": platform.python_version(), "loadavg_start": os.getloadavg(),
                 "env": {k: v for k, v in os.environ.items()
                         if k.startswith(RECORDED_ENV_PREFIXES)}},
        "workload": {"input_len": client.INPUT_LEN, "output_len": client.OUTPUT_LEN,
                     "levels": cfg.levels, "requests": cfg.requests, "time_cap_s": cfg.time_cap_s,
                     "model": cfg.gguf.name},
    }
    print(f"work dir {work}", flush=True)
    servers = make_servers(cfg)
    print("measuring machine limits", flush=True)
    cpu.wait_until_quiet()
    limit_runs = [measure_machine(cfg.cache_root, cfg.gguf)]
    models = model_files(cfg.gguf, cfg.cache_root, any(s.needs_mlx_model for s in servers))
    record["servers"] = []
    for server in servers:
        record["servers"].append(run_server(server, models, cfg, work))
        # A run cut off later still leaves every finished server's results behind.
        (work / "partial-record.json").write_text(json.dumps(record, indent=1))
    # Measured again at the end: the machine is shared, each limit keeps its best.
    cpu.wait_until_quiet()
    limit_runs.append(measure_machine(cfg.cache_root, cfg.gguf))
    record["machine"] = best_of(limit_runs)
    record["machine_runs"] = limit_runs
    record["ours_vs_bound"] = bound_fractions(record)
    record["host"]["loadavg_end"] = os.getloadavg()
    record["duration_s"] = round(time.monotonic() - begin)
    record["work_dir"] = str(work)
    record = history.portable(record, REPO, Path.home())
    history.append_history(cfg.history, record)
    if cfg.docs is not None:
        render(cfg, record)
    return record


def render(cfg: SuiteConfig, record: dict) -> None:
    """Rewrite our docs sections and the plots from one history record."""
    report.update_docs(cfg.docs, record, list(SERVERS))
    draw_plots(cfg.cache_root, record, cfg.docs.parent / "img")


def draw_plots(cache_root: Path, record: dict, out_dir: Path) -> None:
    """The PNGs, drawn in the tools venv (matplotlib); a failure is reported, not raised."""
    run_json = cache_root / "runs" / "render.json"
    run_json.parent.mkdir(parents=True, exist_ok=True)
    run_json.write_text(json.dumps(record))
    try:
        python = ensure_tools_venv(cache_root)
        subprocess.run([str(python), "-m", "benchmarks.suite.plots", str(run_json), str(out_dir)],
                       cwd=REPO, check=True, timeout=300)
    except (InstallError, subprocess.SubprocessError) as e:
        print(f"plots not drawn: {e}", file=sys.stderr)
