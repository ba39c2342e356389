"""Parallelism on one host: serving throughput of two pipeline stages, two tensor
ranks and two data-parallel engines against one rank, and the time MLX's ring takes
for a step's transfers.

    python benchmarks/bench_parallel.py [--model PATH] [--concurrency 1 8]

Servers (bench_serve.py's workload: random 256-token prompts, 128 output tokens,
greedy, --ignore-eos), one after another:
- one rank, the default (the fused decoder stack where the model takes it);
- one rank on the module path (VLLM_METAL_CPU_DECODER_STACK=0), what a tensor rank
  runs;
- --pipeline-parallel-size 2, --tensor-parallel-size 2 (gathering, the CPU's default),
  the same summing partial products (VLLM_METAL_TP_GATHER=0), --data-parallel-size 2
(--cases picks some; --no-ring skips the transfer timings).
Then two processes on 127.0.0.1 join a ring (vllm_metal.distributed.group) and time,
for float32 [rows, hidden] of a decode step's and a prefill chunk's rows, a send/recv
(what passes between pipeline stages), an all-sum (two per layer for summing tensor
ranks) and an all-gather of each rank's [rows, hidden] (two per layer for gathering
ones, of their heads' and MLP columns' slices). Prints markdown tables.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_serve import run_level, tokenizer_for  # noqa: E402
from tests.e2e.server import VllmServer  # noqa: E402
from vllm_metal.cli.bundled import DEFAULT_MODEL  # noqa: E402

_RING = textwrap.dedent("""
    import sys, time
    import mlx.core as mx
    import torch.distributed as dist
    from vllm_metal.distributed.group import join_mlx_group

    rank, port, hidden = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    group = join_mlx_group(dist.group.WORLD, rank, 2, same_host=True)
    def median_ms(step):
        times = []
        for i in range(60):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        return sorted(times[10:])[25] * 1e3

    for rows in (1, 16, 512, 2048):
        x = mx.ones((rows, hidden), dtype=mx.float32)
        if rank == 0:
            send = median_ms(lambda: mx.eval(mx.distributed.send(x, 1, group=group)))
        else:
            send = median_ms(lambda: mx.eval(mx.distributed.recv_like(x, 0, group=group)))
        total = median_ms(lambda: mx.eval(mx.distributed.all_sum(x, group=group)))
        gather = median_ms(lambda: mx.eval(mx.distributed.all_gather(x, group=group)))
        if rank == 1:
            print(rows, hidden, send, total, gather, flush=True)
""")


def ring_times(hidden: int) -> list[tuple[int, float, float, float]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, "-c", _RING, str(r), port, str(hidden)],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
             for r in range(2)]
    out = [p.communicate(timeout=600)[0] for p in procs]
    return [(int(f[0]), float(f[2]), float(f[3]), float(f[4]))
            for f in map(str.split, out[1].splitlines())]


# name -> (label, environment, flags)
CASES = {"default": ("one rank (default)", {}, ()),
         "module": ("one rank, module path", {"VLLM_METAL_CPU_DECODER_STACK": "0"}, ()),
         "pipeline": ("two pipeline stages", {}, ("--pipeline-parallel-size", "2")),
         "tensor": ("two tensor ranks", {}, ("--tensor-parallel-size", "2")),
         "tensor-summed": ("two tensor ranks, summing", {"VLLM_METAL_TP_GATHER": "0"},
                           ("--tensor-parallel-size", "2")),
         "data": ("two data-parallel engines", {}, ("--data-parallel-size", "2"))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL.path())
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=576, help="hidden size for the ring")
    parser.add_argument("--server-args", default="--max-model-len 2048 --max-num-seqs 16")
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--no-ring", action="store_true", help="skip the transfer timings")
    args = parser.parse_args()

    cases = [CASES[name] for name in args.cases]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, env, flags in cases:
            server = VllmServer(str(args.model), "--served-model-name", "m",
                                *args.server_args.split(), *flags,
                                env={**os.environ, **env}, timeout=900)
            try:
                for c in args.concurrency:
                    result, _ = run_level(server.base_url, "m", tokenizer_for(args.model), c,
                                          args, Path(tmp))
                    rows.append((label, c, result["output_throughput"],
                                 result["median_tpot_ms"], result["median_ttft_ms"]))
            finally:
                server.stop()
    print("\n| server | concurrency | output tok/s | median TPOT ms | median TTFT ms |")
    print("|---|---|---|---|---|")
    for label, c, tok_s, tpot, ttft in rows:
        print(f"| {label} | {c} | {tok_s:.1f} | {tpot:.1f} | {ttft:.0f} |")
    if args.no_ring:
        return 0
    print("\n| rows | hidden | ring send+recv, median ms | ring all-sum, median ms "
          "| ring all-gather, median ms |")
    print("|---|---|---|---|---|")
    for n, send, total, gather in ring_times(args.hidden):
        print(f"| {n} | {args.hidden} | {send:.3f} | {total:.3f} | {gather:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
