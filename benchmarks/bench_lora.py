"""LoRA serving benchmark: decode throughput with 0, 1 and 4 adapters active.

    python benchmarks/bench_lora.py [--model PATH] [--concurrency 1 16] [--rank 16]

Random rank-R adapters on every attention and MLP projection of the model (PEFT
format, written to a temporary directory) are served with --enable-lora
--max-loras 4. The workload is bench_serve.py's (random 256-token prompts, 128
output tokens, greedy, --ignore-eos). Rows:
- base, no --enable-lora: the model as it is served without LoRA;
- 0 active: --enable-lora, every request to the base model;
- 1 active: every request to one adapter;
- 4 active: each request to one of four adapters at random (vllm bench's
  --lora-modules);
- with --lora-dtypes auto bfloat16 (the default), the 0, 1 and 4 active rows again
  for each dtype but auto (a server each): the adapters stored in that dtype.
Each server runs its cases in --rounds interleaved rounds; prints a markdown table of
the median output tok/s and median TPOT per concurrency level, and each adapter
case's throughput against the same server's 0 active case (measured in the same
rounds: the fair reference on a host whose speed drifts between runs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_serve import run_level, tokenizer_for  # noqa: E402
from tests.e2e.server import VllmServer  # noqa: E402
from tests.lora_adapters import write_peft  # noqa: E402
from vllm_metal.cli.bundled import DEFAULT_MODEL  # noqa: E402

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapters(model: Path, rank: int, count: int, root: Path) -> list[Path]:
    """COUNT random adapters shaped to MODEL's decoder linears."""
    import mlx.core as mx

    from vllm_metal.lora.layer import linear_features
    from vllm_metal.v1.model_lifecycle import _load_mlx_model

    modules = {}
    for path, module in _load_mlx_model(str(model), mx.float32).named_modules():
        features = linear_features(module)
        if features and ".layers." in f".{path}" and path.rsplit(".", 1)[-1] in TARGETS:
            modules[path] = features
    rng = np.random.default_rng(0)
    adapters = []
    for i in range(count):
        updates = {name: (rng.normal(0, 0.02, (rank, n_in)).astype(np.float32),
                          rng.normal(0, 0.02, (n_out, rank)).astype(np.float32))
                   for name, (n_in, n_out) in modules.items()}
        adapters.append(write_peft(root / f"a{i}", updates, rank, alpha=rank))
    return adapters


def serve_and_measure(model: Path, server_args: list[str], cases: list[tuple[str, str, tuple]],
                      args, tmp: Path) -> list[dict]:
    """One server; every case at every concurrency, in ARGS.rounds interleaved rounds
    (a slow spell of a shared host then falls on every case alike). Each row holds
    the median output tok/s and TPOT over the rounds, and the same ratio against the
    server's first case."""
    server = VllmServer(str(model), "--served-model-name", "base", *server_args, timeout=900)
    runs: dict[tuple[str, int], list[dict]] = {}
    try:
        for _ in range(args.rounds):
            for c in args.concurrency:
                for label, name, extra in cases:
                    result, _cmd = run_level(server.base_url, name, tokenizer_for(model), c,
                                             args, tmp, extra)
                    runs.setdefault((label, c), []).append(result)
    finally:
        server.stop()
    rows = []
    for c in args.concurrency:
        first = None
        for label, _name, _extra in cases:
            results = runs[(label, c)]
            tok_s = float(np.median([r["output_throughput"] for r in results]))
            tpot = float(np.median([r["median_tpot_ms"] for r in results]))
            first = first if first is not None else tok_s
            rows.append(dict(case=label, concurrency=c, tok_s=tok_s, tpot=tpot,
                             vs_first=tok_s / first - 1, reference=cases[0][0]))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL.path())
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--lora-dtypes", nargs="+", default=["auto", "bfloat16"])
    parser.add_argument("--server-args", default="--max-model-len 2048 --max-num-seqs 16")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds of every case per server (medians reported)")
    args = parser.parse_args()

    common = args.server_args.split()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        adapters = write_adapters(args.model, args.rank, 4, root)
        lora = ["--enable-lora", "--max-loras", "4", "--max-lora-rank", str(args.rank),
                "--lora-modules", *(f"a{i}={p}" for i, p in enumerate(adapters))]
        rows = serve_and_measure(args.model, common, [("base, no --enable-lora", "base", ())],
                                 args, root)
        for dtype in args.lora_dtypes:
            tag = "" if dtype == "auto" else f", --lora-dtype {dtype}"
            cases = [(f"0 active{tag}", "base", ()), (f"1 active{tag}", "a0", ()),
                     (f"4 active{tag}", "base", ("--lora-modules", "a0", "a1", "a2", "a3"))]
            rows += serve_and_measure(args.model, common + lora + ["--lora-dtype", dtype],
                                      cases, args, root)

    print(f"\nrank {args.rank}, every attention and MLP projection; medians of "
          f"{args.rounds} interleaved rounds per server\n")
    print("| case | concurrency | output tok/s | median TPOT (ms) | vs the server's first case |")
    print("|---|---|---|---|---|")
    for row in rows:
        vs = "" if row["case"] == row["reference"] else f"{row['vs_first']:+.0%}"
        print(f"| {row['case']} | {row['concurrency']} | {row['tok_s']:.1f} | "
              f"{row['tpot']:.1f} | {vs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
