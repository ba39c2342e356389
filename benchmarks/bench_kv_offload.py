"""KV offloading: time to first token of a long prompt computed afresh, against the
same prompt's KV read back from vLLM's disk tier after a server restart, from the
host tier after the pool evicted it, and from the pool (prefix cache).

    python benchmarks/bench_kv_offload.py [--model PATH] [--prompt 4096] [--rounds 2]
        [--host-gib 2]

Server 1 (host tier + fs disk tier in a fresh directory) gets each round's prompt
once: TTFT "recompute" (no cache anywhere), then again: "pool". Once the disk holds
every full block, it stops. Server 2 (same directory, an empty pool and host tier,
a pool of about 1.2 prompts) gets each prompt: "disk"; then a prompt of other tokens
that evicts it from the pool, and the prompt again: "host". Prompts are
pseudo-random token ids; requests are streamed, greedy, 2 tokens; each figure is
the median of the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.suite.probe import token_times  # noqa: E402
from benchmarks.suite.process import ServerProcess, free_port  # noqa: E402
from benchmarks.suite.servers.base import Launch  # noqa: E402

CACHE = Path.home() / ".cache" / "vllm-metal-bench"
DEFAULT_MODEL = CACHE / "models" / "random-tinyllama-1.1b-q4_0.gguf"
VOCAB_LOW, VOCAB_HIGH = 100, 40000   # ids every llama-family tokenizer here has
BLOCK = 16


def transfer_config(root: Path, host_gib: float) -> str:
    return json.dumps({
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": int(host_gib * 2**30),
            "secondary_tiers": [{"type": "fs", "root_dir": str(root)}]}})


def start(model: Path, root: Path, args, pool_blocks: int | None) -> tuple[ServerProcess, Launch]:
    cli = Path(sys.executable).with_name("vllm-metal")
    context = args.prompt + 64
    port = free_port()
    argv = [str(cli), "serve", str(model), "--served-model-name", "bench", "--host",
            "127.0.0.1", "--port", str(port), "--max-model-len", str(context),
            "--max-num-seqs", "4", "--block-size", str(BLOCK),
            "--kv-transfer-config", transfer_config(root, args.host_gib)]
    if pool_blocks:
        argv += ["--num-gpu-blocks-override", str(pool_blocks)]
    # TinyLlama's shape declares 2048 positions; its weights are random, so positions
    # past that change speed only.
    spec = Launch(argv, model_name="bench", env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    proc = ServerProcess(spec, port, CACHE / "logs" / "kv-offload.log")
    proc.start(1200.0)
    token_times(proc.base_url, spec, "The history of the city begins", 4, 600)
    return proc, spec


def ttft(proc: ServerProcess, spec: Launch, prompt: list[int]) -> float:
    return token_times(proc.base_url, spec, prompt, 2, 1800)[0]


def wait_for_blocks(root: Path, count: int, timeout: float = 600.0) -> float:
    begin = time.monotonic()
    while sum(1 for _ in root.rglob("*.bin")) < count:
        if time.monotonic() - begin > timeout:
            raise SystemExit(f"the disk tier wrote {sum(1 for _ in root.rglob('*.bin'))} "
                             f"of {count} blocks in {timeout:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--prompt", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--host-gib", type=float, default=2.0)
    args = parser.parse_args()
    rng = np.random.default_rng(0)

    def draw() -> list[int]:
        return [int(x) for x in rng.integers(VOCAB_LOW, VOCAB_HIGH, args.prompt)]

    prompts = [draw() for _ in range(args.rounds)]
    times: dict[str, list[float]] = {"recompute": [], "pool": [], "disk": [], "host": []}
    with tempfile.TemporaryDirectory(prefix="kv-offload-") as tmp:
        root = Path(tmp)
        proc, spec = start(args.model, root, args, None)
        try:
            for p in prompts:
                times["recompute"].append(ttft(proc, spec, p))
                times["pool"].append(ttft(proc, spec, p))
            waited = wait_for_blocks(root, args.rounds * (args.prompt // BLOCK))
        finally:
            proc.stop()
            time.sleep(5)
        disk_bytes = sum(f.stat().st_size for f in root.rglob("*.bin"))
        # A pool of about 1.2 prompts: a second long prompt evicts the first.
        proc, spec = start(args.model, root, args, int(1.2 * args.prompt / BLOCK) + 8)
        try:
            for p in prompts:
                times["disk"].append(ttft(proc, spec, p))
                ttft(proc, spec, draw())
                times["host"].append(ttft(proc, spec, p))
        finally:
            proc.stop()
    print(json.dumps({k: [round(t, 3) for t in v] for k, v in times.items()}))
    print(f"disk tier: {disk_bytes / 2**20:.1f} MiB for {args.rounds} prompts; the last "
          f"block reached disk {waited:.1f} s after the last request")
    print(f"| {args.prompt}-token prefix | TTFT (median of {args.rounds}) | vs recompute |")
    print("|---|---|---|")
    base = statistics.median(times["recompute"])
    for name in ("recompute", "disk", "host", "pool"):
        t = statistics.median(times[name])
        print(f"| {name} | {t:.2f} s | {t / base:.3f}x |")


if __name__ == "__main__":
    main()
