"""LoRA's cost per decode step of the CPU decoder stack, interleaved with the base step.

    python benchmarks/bench_lora_step.py [--model PATH] [--rows 1 16] [--rank 16]

Loads the model (the bundled SmolLM2 by default) once per adapter dtype with every
decoder linear wrapped for LoRA, places one random rank-R adapter on all of them, and
times the decoder stack's evaluation for a decode step of R rows (one token each):
the base model, then the adapter stored in each dtype, in turn, step after step, so
a slow spell of a shared host falls on every case alike. Prints the median step
time of each case and what the adapter adds. Serving throughput is bench_lora.py's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import mlx.core as mx  # noqa: E402

from tests.cpu.test_decoder_stack import BLOCK, _meta  # noqa: E402
from tests.cpu.test_stack_lora import random_adapter  # noqa: E402
from vllm_metal.attention.context import ForwardContext, forward_context  # noqa: E402
from vllm_metal.cli.bundled import DEFAULT_MODEL  # noqa: E402
from vllm_metal.cpu.backend import CpuBackend  # noqa: E402
from vllm_metal.lora.bank import LoRABank  # noqa: E402
from vllm_metal.lora.layer import wrap_linears  # noqa: E402
from vllm_metal.v1.model_lifecycle import load_model  # noqa: E402


def load(model: Path, rank: int, dtype: mx.Dtype):
    found = {}

    def wrap(m):
        found["bank"] = LoRABank(1, rank, dtype)
        found["modules"] = wrap_linears(m, found["bank"], None)

    loaded = load_model(str(model), mx.float32, CpuBackend(), wrap)
    if loaded.backbone.stack is None:
        raise SystemExit(f"{model}: the decoder stack does not take this model")
    return loaded, found["bank"], found["modules"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL.path())
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    models = {name: load(args.model, args.rank, getattr(mx, name)) for name in args.dtypes}
    first = models[args.dtypes[0]]
    adapter = random_adapter(first[2], 1, args.rank)
    dims = first[0].dims
    print(f"{args.model.name}: rank {args.rank} on {len(first[2])} linears; "
          f"median of {args.steps} interleaved steps\n")
    print("| rows | case | step (ms) | added (ms) | of base throughput |")
    print("|---|---|---|---|---|")
    for rows in args.rows:
        caches = [mx.zeros((rows, BLOCK, dims.num_kv_heads, dims.head_dim))
                  for _ in range(2 * dims.num_layers)]
        mx.eval(caches)
        ids = mx.array([[5] * rows], dtype=mx.int32)
        seqs = [(i, 0, 1) for i in range(rows)]

        def step(loaded, bank, adapter_id):
            bank.prepare_step(np.full(rows, adapter_id), {1: adapter}.__getitem__)
            ctx = ForwardContext(_meta(seqs), caches[:dims.num_layers],
                                 caches[dims.num_layers:])
            with forward_context(ctx):
                hidden = loaded.backbone(ids)
            start = time.perf_counter()
            mx.eval(hidden)
            return time.perf_counter() - start

        cases = {"base": (first, 0)}
        cases.update({f"adapter, {name}": (models[name], 1) for name in args.dtypes})
        times = {case: [] for case in cases}
        for i in range(args.steps + 10):
            for case, ((loaded, bank, _), adapter_id) in cases.items():
                t = step(loaded, bank, adapter_id)
                if i >= 10:   # warm-up
                    times[case].append(t)
        base = float(np.median(times["base"]))
        for case, ts in times.items():
            t = float(np.median(ts))
            print(f"| {rows} | {case} | {t * 1e3:.2f} | {(t - base) * 1e3:+.2f} | "
                  f"{base / t:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
