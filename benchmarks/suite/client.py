"""The workload: `vllm bench serve` on the random dataset, one run per concurrency level.

The client's own warm-up is off (`--num-warmups 0`): it would resend the level's first
prompt, which every server then answers from its prefix cache, and it costs the MLX
peers ~45 s a level. The suite warms each server up once instead (probe.py).
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.suite.servers.base import Launch

INPUT_LEN = 256
OUTPUT_LEN = 128
REQUESTS_PER_LEVEL = {1: 8, 4: 16, 16: 48}


@dataclass(frozen=True)
class Level:
    concurrency: int
    num_prompts: int
    seed: int


def default_requests(concurrency: int) -> int:
    return REQUESTS_PER_LEVEL.get(concurrency, 3 * concurrency)


def level_seed(concurrency: int) -> int:
    # A different seed per level, so a server's prefix cache never sees a prompt twice.
    return 1000 + concurrency


def bench_command(base_url: str, launch: Launch, tokenizer: Path, level: Level,
                  result_dir: Path, result_name: str) -> list[str]:
    """The exact `vllm bench serve` argv for one level."""
    vllm = Path(sys.executable).with_name("vllm")
    cmd = [str(vllm), "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions",
           "--base-url", base_url, "--model", launch.model_name, "--tokenizer", str(tokenizer),
           "--dataset-name", "random", "--random-input-len", str(INPUT_LEN),
           "--random-output-len", str(OUTPUT_LEN), "--random-range-ratio", "0",
           "--num-prompts", str(level.num_prompts), "--max-concurrency", str(level.concurrency),
           "--request-rate", "inf", "--temperature", "0", "--ignore-eos",
           "--seed", str(level.seed), "--num-warmups", "0", "--disable-tqdm",
           "--save-result", "--save-detailed", "--result-dir", str(result_dir),
           "--result-filename", result_name]
    if launch.extra_body:
        cmd += ["--extra-body", json.dumps(launch.extra_body)]
    return cmd


def summarize(raw: dict) -> dict:
    """The row fields kept in history: throughput, latency medians, counts, output lengths."""
    lens = [n for n in raw.get("output_lens", []) if n]
    # A traceback's last line names the failure.
    errors = sorted({e.strip().splitlines()[-1][:300]
                     for e in raw.get("errors", []) if e and e.strip()})
    return {
        "completed": raw.get("completed", 0),
        "failed": raw.get("failed", 0),
        "duration_s": raw.get("duration"),
        "output_tok_s": raw.get("output_throughput"),
        "median_ttft_ms": raw.get("median_ttft_ms"),
        "median_tpot_ms": raw.get("median_tpot_ms"),
        "median_itl_ms": raw.get("median_itl_ms"),
        "output_len_min": min(lens) if lens else None,
        "output_len_median": statistics.median(lens) if lens else None,
        "output_len_max": max(lens) if lens else None,
        "errors": errors[:5],
    }


def run_level(base_url: str, launch: Launch, tokenizer: Path, level: Level, work: Path,
              timeout: float | None, tag: str) -> dict:
    """Run one level; a failed or timed-out client becomes a row with `status`, not an exception.

    Result and log files in `work` are named after `tag` (the server) and the level.
    """
    name = f"{tag}-c{level.concurrency}-n{level.num_prompts}.json"
    result = work / name
    result.unlink(missing_ok=True)
    cmd = bench_command(base_url, launch, tokenizer, level, work, name)
    log = work / f"client-{tag}-c{level.concurrency}.log"
    row = {"concurrency": level.concurrency, "num_prompts": level.num_prompts,
           "seed": level.seed, "command": shlex.join(cmd)}
    begin = time.monotonic()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = None
    row["wall_s"] = round(time.monotonic() - begin, 1)
    if rc is None:
        row["status"] = f"client timed out after {timeout:.0f}s"
    elif rc != 0 or not result.exists():
        row["status"] = f"client exited with {rc}: " + log.read_text(errors="replace")[-400:]
    else:
        row.update(summarize(json.loads(result.read_text())))
        row["status"] = "ok" if row["completed"] else "all requests failed"
    return row
