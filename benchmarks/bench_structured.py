"""Structured-output serving benchmark: constrained decode against unconstrained.

    python benchmarks/bench_structured.py [--model PATH] [--concurrency 1 16]

One server (the bundled SmolLM2 by default) and bench_serve.py's workload (random
256-token prompts, 128 output tokens, greedy, --ignore-eos), run four ways:
- plain: no constraint;
- json_schema: every request carries a JSON schema (an array of at least 400
  short strings, so no output completes it within 128 tokens: every step is
  constrained and none ends early);
- regex: every request carries a regex of the same kind (400 lower-case words);
- mixed (c >= 2): two clients at c/2 each, one plain and one with the JSON
  schema, so constrained and plain rows share every batch.
Each constrained request goes through vLLM's structured-output manager (xgrammar
unless --server-args picks another backend), which advances the grammar and fills
the step's bitmask in the scheduler; the worker masks the logits inside the step's
kernels. Each case and level draws its own random prompts (prefix caching would
otherwise serve a later case's prefill from an earlier one's). Prints a markdown table of output tok/s and
median TPOT per case and concurrency, with each case's share of plain.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_serve import run_level, tokenizer_for  # noqa: E402
from tests.e2e.server import VllmServer  # noqa: E402
from vllm_metal.cli.bundled import DEFAULT_MODEL  # noqa: E402

# Long enough that 128 tokens never complete it: the grammar never leaves only EOS.
SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 400}
REGEX = "[a-z]{1,8}( [a-z]{1,8}){400}"


def cases() -> list[tuple[str, tuple[str, ...]]]:
    """(label, extra `vllm bench serve` flags). Each case draws its own prompts (seed):
    with the same prompts, a later case would find their prefill in the prefix cache."""
    schema = {"structured_outputs": {"json": SCHEMA}}
    regex = {"structured_outputs": {"regex": REGEX}}
    return [
        ("plain", ("--seed", "2000")),
        ("json_schema", ("--extra-body", json.dumps(schema), "--seed", "3000")),
        ("regex", ("--extra-body", json.dumps(regex), "--seed", "4000")),
    ]


def with_level_seed(extra: tuple[str, ...], concurrency: int, client: int = 0) -> tuple:
    """EXTRA with its --seed moved on by the level (and the mixed case's client)."""
    i = extra.index("--seed")
    seed = int(extra[i + 1]) + concurrency + 100 * client
    return extra[:i + 1] + (str(seed),) + extra[i + 2:]


def mixed_level(base_url: str, name: str, tokenizer: str, concurrency: int, args,
                out_dir: Path) -> tuple[dict, list[str]]:
    """Plain and json_schema clients at CONCURRENCY/2 each, at once (vllm bench serve
    gives all its requests one extra body). Returns the summed result."""
    from concurrent.futures import ThreadPoolExecutor

    half = concurrency // 2
    runs = []
    with ThreadPoolExecutor(2) as pool:
        for i, (_, extra) in enumerate(cases()[:2]):
            where = out_dir / f"mixed{i}"
            where.mkdir(exist_ok=True)
            runs.append(pool.submit(run_level, base_url, name, tokenizer, half, args, where,
                                    with_level_seed(extra, concurrency, client=5 + i)))
    (a, cmd_a), (b, cmd_b) = (r.result() for r in runs)
    total = {k: a[k] + b[k] for k in ("completed", "failed", "total_output_tokens",
                                     "output_throughput")}
    total["median_tpot_ms"] = (a["median_tpot_ms"] + b["median_tpot_ms"]) / 2
    return total, cmd_a + ["&"] + cmd_b


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL.path())
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--cases", nargs="+", default=["plain", "json_schema", "regex", "mixed"])
    parser.add_argument("--server-args", default="--max-model-len 2048 --max-num-seqs 16",
                        help="extra `vllm serve` flags (one string), e.g. "
                             "--structured-outputs-config {\"backend\":\"guidance\"}")
    args = parser.parse_args()

    name = "bench-model"
    server = VllmServer(str(args.model), "--served-model-name", name,
                        *args.server_args.split(), timeout=900)
    tokenizer = tokenizer_for(args.model)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            levels = [(label, c) for label, _ in cases() for c in args.concurrency]
            levels += [("mixed", c) for c in args.concurrency if c >= 2]
            levels = [(label, c) for label, c in levels if label in args.cases]
            for label, c in levels:
                if label == "mixed":
                    result, cmd = mixed_level(server.base_url, name, tokenizer, c, args,
                                              Path(tmp))
                else:
                    extra = with_level_seed(dict(cases())[label], c)
                    result, cmd = run_level(server.base_url, name, tokenizer, c, args,
                                            Path(tmp), extra)
                expected = result["completed"] * args.output_len
                if result.get("failed") or result["total_output_tokens"] != expected:
                    raise SystemExit(f"{label} c={c}: {result.get('failed')} failed, "
                                     f"{result['total_output_tokens']} of {expected} tokens")
                rows.append(dict(case=label, concurrency=c, command=" ".join(cmd),
                                 result=result))
    finally:
        server.stop()

    plain = {r["concurrency"]: r["result"]["output_throughput"]
             for r in rows if r["case"] == "plain"}
    print(f"\n{args.model.name}\n")
    print("| case | concurrency | output tok/s | median TPOT (ms) | of plain |")
    print("|---|---|---|---|---|")
    for row in rows:
        r, c = row["result"], row["concurrency"]
        share = r["output_throughput"] / plain[c]
        print(f"| {row['case']} | {c} | {r['output_throughput']:.1f} | "
              f"{r['median_tpot_ms']:.1f} | {share:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
