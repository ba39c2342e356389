"""Serving benchmark: start vllm-metal's server, drive it with `vllm bench serve`.

    python benchmarks/bench_serve.py [--model PATH] [--concurrency 1 4] [--out results.json]

Workload (as in docs/benchmarks.md): random dataset, 256 input / 128 output
tokens, --ignore-eos, greedy, one warm-up request, a different seed per level so
prefix caching never hits. Prints a markdown table of output tok/s, median TTFT
and median TPOT per concurrency level.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.server import VllmServer  # noqa: E402
from vllm_metal.cli.bundled import DEFAULT_MODEL  # noqa: E402

REQUESTS_PER_LEVEL = {1: 8, 4: 16, 16: 48}


def tokenizer_for(model: Path) -> str:
    """`vllm bench serve` needs an HF tokenizer; a GGUF's comes from its metadata."""
    from vllm_metal.gguf_plugin import gguf_model_file

    if gguf_model_file(str(model)) is None:
        return str(model)
    from vllm_metal import envs
    from vllm_metal.gguf.loader import materialize_hf_dir

    return str(materialize_hf_dir(model, cache_root=envs.VLLM_METAL_GGUF_CACHE))


def run_level(base_url: str, name: str, tokenizer: str, concurrency: int, args, out_dir: Path,
              extra: tuple[str, ...] = ()):
    """EXTRA: more `vllm bench serve` flags (e.g. --lora-modules)."""
    num_prompts = args.num_prompts or REQUESTS_PER_LEVEL.get(concurrency, 4 * concurrency)
    result = out_dir / f"c{concurrency}.json"
    vllm = Path(sys.executable).with_name("vllm")
    cmd = [str(vllm), "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions",
           "--base-url", base_url, "--model", name, "--tokenizer", tokenizer,
           "--dataset-name", "random", "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--random-range-ratio", "0",
           "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
           "--request-rate", "inf", "--temperature", "0", "--ignore-eos",
           "--seed", str(1000 + concurrency), "--num-warmups", "1", "--disable-tqdm",
           "--save-result", "--result-dir", str(out_dir), "--result-filename", result.name,
           *extra]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(result.read_text()), cmd


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL.path())
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1])
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--server-args", default="--max-model-len 2048 --max-num-seqs 16",
                        help="extra `vllm serve` flags (one string)")
    parser.add_argument("--out", type=Path, default=None, help="write all results as JSON")
    args = parser.parse_args()

    name = "bench-model"
    server = VllmServer(str(args.model), "--served-model-name", name,
                        *args.server_args.split(), timeout=900)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for c in args.concurrency:
                result, cmd = run_level(server.base_url, name, tokenizer_for(args.model), c,
                                        args, Path(tmp))
                rows.append(dict(concurrency=c, command=" ".join(cmd), result=result))
    finally:
        server.stop()

    print("\n| concurrency | requests | output tok/s | median TTFT (ms) | median TPOT (ms) |")
    print("|---|---|---|---|---|")
    for row in rows:
        r = row["result"]
        print(f"| {row['concurrency']} | {r['completed']} | {r['output_throughput']:.1f} | "
              f"{r['median_ttft_ms']:.0f} | {r['median_tpot_ms']:.1f} |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
