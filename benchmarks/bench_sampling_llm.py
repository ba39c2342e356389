"""In-process throughput under sampling parameters: the CPU sampling kernel or MLX ops.

Runs vLLM's offline `LLM` on the bundled SmolLM2 (both fast CPU settings on)
and prints output tok/s for 1 and for 16 concurrent requests (256-token
prompts, 128 output tokens, `ignore_eos`) under each sampling setting, once
with the sampler's CPU kernel and once with its MLX-ops path (Gumbel-max;
keys made on the host in both). docs/benchmarks.md, "Sampling".

    python benchmarks/bench_sampling_llm.py --sampler kernel
    python benchmarks/bench_sampling_llm.py --sampler mlx
"""

from __future__ import annotations

import argparse
import os
import time

SETTINGS = [
    {"temperature": 0.0},
    {"temperature": 1.0},
    {"temperature": 0.8, "top_p": 0.9},
    {"temperature": 0.7, "top_k": 20, "top_p": 0.8},
    {"temperature": 1.0, "logprobs": 5},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sampler", choices=("kernel", "mlx"), required=True)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    from vllm import LLM, SamplingParams

    from vllm_metal.cli.bundled import DEFAULT_MODEL
    from vllm_metal.cpu.backend import CpuBackend

    # The engine runs in this process (no V1 multiprocessing): its runner reads this.
    CpuBackend.sampling_kernels = args.sampler == "kernel"
    model = DEFAULT_MODEL.path()
    if model is None:
        raise SystemExit(f"the bundled model needs the {DEFAULT_MODEL.package} package")
    llm = LLM(model=str(model), max_model_len=2048, max_num_seqs=16, seed=0)
    warm = SamplingParams(max_tokens=16, ignore_eos=True)
    llm.generate([{"prompt_token_ids": list(range(100, 356))}], warm, use_tqdm=False)
    print("| sampler | setting | 1 request (tok/s) | 16 requests (tok/s) |")
    print("|---|---|---|---|")
    for k, setting in enumerate(SETTINGS):
        params = SamplingParams(max_tokens=128, ignore_eos=True, **setting)
        rates = []
        for n in (1, 16):
            prompts = [{"prompt_token_ids": list(range(1000 + 300 * i + 5000 * k + n,
                                                       1256 + 300 * i + 5000 * k + n))}
                       for i in range(n)]
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            rates.append(n * 128 / (time.perf_counter() - start))
        label = ", ".join(f"{key} {value}" for key, value in setting.items())
        print(f"| {args.sampler} | {label} | {rates[0]:.1f} | {rates[1]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
