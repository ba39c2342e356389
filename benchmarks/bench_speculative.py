"""Speculative decoding on a copying workload: output tok/s with and without drafts.

    python benchmarks/bench_speculative.py [--model PATH] [--concurrency 1 8]
        [--spec none ngram draft_model] [--draft PATH] [--k 3] [--rounds 3]
        [--out results.json]

Workload: the chat model is asked to reproduce a passage with one edit (the passages
are the paragraphs of this repository's docs, 300-900 characters each): most of its
answer is a copy of its prompt, which a prompt lookup drafts. Greedy, up to 256 tokens,
stopping at EOS; every configuration answers the same requests with the same tokens,
so tok/s compare like with like. One server per configuration, all started first;
each level runs `--rounds` times per server, alternating between servers, and the
median run is reported (this machine's speed drifts by tens of percent over
minutes). One warm-up round before each run. Acceptance comes from the server's
/metrics; each answer is compared with the answer to the same request without
speculation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.server import VllmServer  # noqa: E402
from vllm_metal.cli.bundled import DEFAULT_MODEL  # noqa: E402

INSTRUCTION = ("Copy the following text exactly, word for word, but replace the word "
               "\"the\" with \"THE\" the first time it appears. Output only the text.\n\n")


def passages(count: int) -> list[str]:
    found = []
    for doc in sorted((REPO / "docs").glob("*.md")):
        for para in re.split(r"\n\s*\n", doc.read_text()):
            text = " ".join(para.split())
            if 300 <= len(text) <= 900 and not text.startswith(("|", "#", "```", "-", "*")):
                found.append(text)
    if len(found) < count:
        raise SystemExit(f"only {len(found)} passages in docs/, {count} wanted")
    return found[:count]


def spec_args(kind: str, k: int, draft: Path | None) -> tuple[str, ...]:
    if kind == "none":
        return ()
    if kind == "ngram":
        cfg = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2,
               "prompt_lookup_max": 5}
    else:
        cfg = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k}
    return ("--speculative-config", json.dumps(cfg))


def counters(base_url: str) -> dict[str, float]:
    import requests

    out = {}
    for line in requests.get(base_url + "/metrics", timeout=10).text.splitlines():
        for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            if line.startswith(f"vllm:spec_decode_{name}_total"):
                out[name] = float(line.split()[-1])
    return out


def run_level(base_url: str, texts: list[str], concurrency: int, max_tokens: int) -> dict:
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", timeout=600)

    def ask(text: str) -> tuple[int, str]:
        out = client.chat.completions.create(
            model="bench", messages=[{"role": "user", "content": INSTRUCTION + text}],
            max_tokens=max_tokens, temperature=0.0)
        return out.usage.completion_tokens, out.choices[0].message.content

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(ask, texts[:concurrency]))               # warm-up round
        before = counters(base_url)
        start = time.perf_counter()
        answers = list(pool.map(ask, texts))
        elapsed = time.perf_counter() - start
    after = counters(base_url)
    tokens = sum(n for n, _ in answers)
    result = {"concurrency": concurrency, "requests": len(texts), "output_tokens": tokens,
              "seconds": elapsed, "tok_per_s": tokens / elapsed,
              "answers": [a for _, a in answers]}
    if after:
        drafted = after["num_draft_tokens"] - before.get("num_draft_tokens", 0)
        accepted = after["num_accepted_tokens"] - before.get("num_accepted_tokens", 0)
        steps = after["num_drafts"] - before.get("num_drafts", 0)
        result.update(acceptance=accepted / drafted if drafted else 0.0,
                      accepted_per_draft_step=accepted / steps if steps else 0.0)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL.path())
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--spec", nargs="+", default=["none", "ngram"],
                        choices=["none", "ngram", "draft_model"])
    parser.add_argument("--draft", type=Path, default=None,
                        help="draft checkpoint for draft_model (default: the target)")
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs per configuration and level (the median is reported)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    texts = passages(args.requests)
    servers = {}
    env = {**os.environ, "VLLM_METAL_CPU_KV_CACHE_GIB": "1"}
    try:
        for kind in args.spec:
            servers[kind] = VllmServer(
                str(args.model), "--max-model-len", "2048", "--max-num-seqs", "16",
                "--served-model-name", "bench",
                *spec_args(kind, args.k, args.draft or args.model), timeout=600, env=env)
        runs: dict[tuple[str, int], list[dict]] = {}
        # The servers idle while another runs; rounds alternate between them so a
        # drift in the machine's speed touches every configuration alike.
        for c in args.concurrency:
            for _ in range(args.rounds):
                for kind, srv in servers.items():
                    r = run_level(srv.base_url, texts, c, args.max_tokens)
                    r["spec"] = kind
                    runs.setdefault((kind, c), []).append(r)
                    print(json.dumps({k: v for k, v in r.items() if k != "answers"}),
                          flush=True)
    finally:
        for srv in servers.values():
            srv.stop()
    results = []
    for (kind, c), rs in runs.items():
        best = sorted(rs, key=lambda r: r["tok_per_s"])[len(rs) // 2]   # the median run
        results.append({**best, "tok_per_s_runs": [r["tok_per_s"] for r in rs]})
    base = {r["concurrency"]: r for r in results if r["spec"] == "none"}
    print("\n| spec | c | output tok/s | vs none | answers as none's | acceptance "
          "| accepted/step |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        ref = base.get(r["concurrency"])
        ratio = f"{r['tok_per_s'] / ref['tok_per_s']:.2f}x" if ref else ""
        same = (f"{sum(a == b for a, b in zip(r['answers'], ref['answers']))}/{len(texts)}"
                if ref else "")
        print(f"| {r['spec']} | {r['concurrency']} | {r['tok_per_s']:.1f} | {ratio} | {same} | "
              f"{r.get('acceptance', 0):.2f} | {r.get('accepted_per_draft_step', 0):.2f} |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
