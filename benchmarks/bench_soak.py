"""Soak: serve the bundled model under mixed load for a long time, sampling memory.

    python benchmarks/bench_soak.py [--mode default|exact|no-prefix-cache|preemption]
                                    [--minutes 30] [--clients 8] [--warmup-minutes 5]

Starts `vllm serve` on the bundled SmolLM2 (or --model), runs the mixed load of
benchmarks/soak/workload.py from --clients concurrent clients, and samples the
resident memory of the server's processes every --interval seconds. After the
warm-up it fits a line to the engine's RSS: the target is a slope below 2 MiB per
minute with the peak inside the engine's memory budget (from its log). Writes the
samples and summary to benchmarks/soak/results/MODE.json and the plot to
docs/img/soak_MODE.png; exits 1 when a target or a request check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.soak.memory import (MiB, budget_from_log, slope_mib_per_min,  # noqa: E402
                                    target_met, tree_rss)
from benchmarks.suite.run import git  # noqa: E402
from benchmarks.soak.workload import run_load  # noqa: E402
from tests.e2e.server import VllmServer  # noqa: E402
from vllm_metal.cli.bundled import DEFAULT_MODEL  # noqa: E402

MODES = {  # mode -> (environment, extra server arguments)
    "default": ({}, []),   # int8 activations, an fp16 KV cache
    "exact": ({"VLLM_METAL_CPU_INT8_ACTIVATIONS": "0"}, []),
    "no-prefix-cache": ({}, ["--no-enable-prefix-caching"]),
    # A pool of ~2,200 tokens (one --max-model-len request and a little) for 8 clients'
    # up to ~850 each: running requests are preempted and recomputed.
    "preemption": ({}, ["--kv-cache-memory", str(50 * MiB)]),
}


class Sampler(threading.Thread):
    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.start_time = time.monotonic()
        self.samples: list[dict] = []
        self.stopped = threading.Event()

    def sample(self) -> None:
        self.samples.append({"t": round(time.monotonic() - self.start_time, 1),
                             **tree_rss(self.pid)})

    def run(self) -> None:
        while not self.stopped.is_set():
            self.sample()
            self.stopped.wait(self.interval)


def summarize(samples: list[dict], warmup_s: float, tally, budget: dict) -> dict:
    after = [s for s in samples if s["t"] >= warmup_s] or samples
    warm = after[0]
    peak_engine = max(s["engine"] for s in samples)
    slopes = {f"{k}_slope_mib_per_min": round(slope_mib_per_min([(s["t"], s[k]) for s in after]), 3)
              for k in ("engine", "api", "total")}
    budget_bytes = budget.get("budget", 0) * 2**30
    return {
        "output_tokens": tally.output_tokens,
        "requests_sent": sum(tally.sent.values()),
        "requests_ok": sum(tally.ok.values()),
        "by_kind": {k: [tally.ok[k], tally.sent[k]] for k in sorted(tally.sent)},
        "canaries": tally.canaries,
        "unexpected": tally.unexpected,
        **slopes,
        "engine_mib_after_warmup": round(warm["engine"] / MiB),
        "engine_mib_end": round(samples[-1]["engine"] / MiB),
        "engine_mib_peak": round(peak_engine / MiB),
        "total_mib_peak": round(max(s["total"] for s in samples) / MiB),
        "budget": budget,
        "peak_within_budget": bool(budget_bytes) and peak_engine <= budget_bytes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="default")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL.path())
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--warmup-minutes", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/soak/results/MODE.json")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args()

    env, server_args = MODES[args.mode]
    os.environ.update(env)
    out = args.out or REPO / "benchmarks" / "soak" / "results" / f"{args.mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    # The code the server runs, whatever lands while it does.
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    server = VllmServer(str(args.model), "--served-model-name", "smollm2", "--max-model-len",
                        "2048", *server_args)
    try:
        sampler = Sampler(server.proc.pid, args.interval)
        sampler.start()
        begin = time.monotonic()
        tally = asyncio.run(run_load(server.base_url, "smollm2", args.clients, args.minutes * 60))
        load_s = time.monotonic() - begin
        preemptions = _metric(server.base_url, "vllm:num_preemptions_total")
        time.sleep(2 * args.interval)  # idle: what is still held once the load has stopped
        sampler.stopped.set()
        sampler.join()
        log = Path(server.log.name).read_text(errors="replace")
    finally:
        server.stop()
    budget = budget_from_log(log)
    summary = summarize(sampler.samples, args.warmup_minutes * 60, tally, budget)
    summary["load_s"] = round(load_s)
    summary["preemptions"] = preemptions
    run = {"mode": args.mode, "env": env, "server_args": server_args,
           "command": " ".join(["python", "benchmarks/bench_soak.py", *sys.argv[1:]]),
           "clients": args.clients, "warmup_s": args.warmup_minutes * 60,
           "commit": commit, "summary": summary, "samples": sampler.samples}
    out.write_text(json.dumps(run, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    if not args.no_plot:
        _plot(out, REPO / "docs" / "img" / f"soak_{args.mode.replace('-', '_')}.png")
    passed = target_met(summary) and not summary["unexpected"]
    print("PASS" if passed else "FAIL", f"(samples in {out})")
    return 0 if passed else 1


def _metric(base_url: str, name: str) -> float | None:
    """The sum of a counter's series on the server's /metrics, or None if absent."""
    import requests

    try:
        text = requests.get(base_url + "/metrics", timeout=10).text
    except requests.RequestException:
        return None
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    return sum(values) if values else None


def _plot(run_json: Path, png: Path) -> None:
    from benchmarks.suite.install import DEFAULT_CACHE_ROOT, ensure_tools_venv

    try:
        python = ensure_tools_venv(DEFAULT_CACHE_ROOT.expanduser())
        subprocess.run([str(python), "-m", "benchmarks.soak.plot", str(run_json), str(png)],
                       cwd=REPO, check=True)
        print(f"plot: {png}")
    except Exception as e:  # the samples are written; a plot can be drawn later
        print(f"plot not drawn: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
