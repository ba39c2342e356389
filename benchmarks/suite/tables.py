"""Markdown tables and lines rendered from one history record."""

from __future__ import annotations

# A level during which other processes took more than this share of the machine's CPU
# is flagged: its figures are depressed by them.
OTHER_CPU_FLAG_PCT = 10.0


def fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def level_row(server: dict, c: int) -> dict | None:
    return next((r for r in server.get("levels", []) if r["concurrency"] == c), None)


def is_skipped(row: dict) -> bool:
    return str(row.get("status", "")).startswith("skipped")


def busy_machine(row: dict) -> bool:
    return (row.get("other_cpu_pct") or 0) > OTHER_CPU_FLAG_PCT


def summary_cell(server: dict, row: dict | None) -> str:
    """One server x level output tok/s, with `*` (time-capped) and `†` (busy machine)."""
    if row is None:
        return "-" if server.get("status") == "ok" else "failed"
    if is_skipped(row):
        return "skipped"
    if not row.get("completed"):
        return "failed"
    marks = ("*" if row.get("capped") else "") + ("†" if busy_machine(row) else "")
    return fmt(row.get("output_tok_s")) + (f" {marks}" if marks else "")


def summary_table(record: dict) -> str:
    """server x concurrency output tok/s, plus median TTFT at the highest level."""
    levels = record["workload"]["levels"]
    top = max(levels)
    head = ["server", *[f"c={c} out tok/s" for c in levels], f"c={top} median TTFT"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in record["servers"]:
        cells = [s["label"], *[summary_cell(s, level_row(s, c)) for c in levels]]
        row = level_row(s, top)
        ttft = row.get("median_ttft_ms") if row and row.get("completed") else None
        cells.append("-" if ttft is None else f"{ttft / 1000:.2f} s")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def level_status(row: dict) -> str:
    status = str(row.get("status", ""))
    if status == "ok" and row.get("failed"):
        errors = row.get("errors") or ["no error text"]
        status = f"ok; {row['failed']} failed: {errors[0]}"
    return cell_text(status)


def cell_text(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return (text[:limit] + "...") if len(text) > limit else text


def detail_table(record: dict) -> str:
    head = ["server", "c", "requests ok/failed (ran of asked)", "output tok/s",
            "median TTFT (ms)", "median TPOT (ms)", "output len min/med/max",
            "CPU % server/client/other", "wall (s)", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in record["servers"]:
        if not s.get("levels"):
            lines.append(f"| {s['server']} | - | - | - | - | - | - | - | - | "
                         f"{cell_text(s['status'])} |")
            continue
        for r in s["levels"]:
            asked = r.get("requested", r.get("num_prompts"))
            reqs = (f"{r.get('completed', 0)}/{r.get('failed', 0)} ({r.get('num_prompts', 0)} of "
                    f"{asked}{', time cap' if r.get('capped') else ''})")
            lens = "/".join(fmt(r.get(k), 0) for k in
                            ("output_len_min", "output_len_median", "output_len_max"))
            cpu = "/".join(fmt(r.get(k), 0) for k in
                           ("server_cpu_pct", "client_cpu_pct", "other_cpu_pct"))
            lines.append(f"| {s['server']} | {r['concurrency']} | {reqs} | "
                         f"{fmt(r.get('output_tok_s'))} | {fmt(r.get('median_ttft_ms'), 0)} | "
                         f"{fmt(r.get('median_tpot_ms'))} | {lens} | {cpu} | "
                         f"{fmt(r.get('wall_s'), 0)} | {level_status(r)} |")
    return "\n".join(lines)


def _load(value) -> str:
    return "-" if not value else f"{value[0]:.2f}"


def server_table(record: dict) -> str:
    """Per server: startup, how busy the machine was before it, load average around it."""
    head = ["server", "startup (s)", "CPU busy before start", "load avg (1 min) before / after",
            "probe TTFT (s) / TPOT (ms)", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in record["servers"]:
        busy = s.get("cpu_busy_before_pct")
        busy_text = "-" if busy is None else (
            f"{busy:.0f}%" + ("" if s.get("quiet", True) else
                              f" (not quiet after {s.get('quiet_wait_s', 0):.0f} s)"))
        probe = s.get("probe") or {}
        probe_text = ("-" if not probe else
                      f"{probe['ttft_s']:.2f} / {1000 * probe['tpot_s']:.1f}")
        lines.append(f"| {s['server']} | {fmt(s.get('startup_s'), 0)} | {busy_text} | "
                     f"{_load(s.get('loadavg_before'))} / {_load(s.get('loadavg_after'))} | "
                     f"{probe_text} | {cell_text(s.get('status', ''))} |")
    return "\n".join(lines)


def bound_fractions(record: dict) -> list[dict]:
    """Each of our servers' single-stream decode (1000 / median TPOT at c=1) and output
    rate against the machine's decode bound."""
    bound = (record.get("machine") or {}).get("decode_bound_tok_s")
    out = []
    for s in record["servers"]:
        row = level_row(s, 1)
        if not (bound and s["server"].startswith("ours") and row and row.get("median_tpot_ms")
                and row.get("output_tok_s")):
            continue
        decode = 1000.0 / row["median_tpot_ms"]
        out.append({"server": s["server"], "decode_tok_s": decode,
                    "decode_fraction": decode / bound, "output_tok_s": row["output_tok_s"],
                    "output_fraction": row["output_tok_s"] / bound})
    return out


def machine_lines(record: dict) -> list[str]:
    m = record.get("machine") or {}
    if "error" in m or not m:
        return [f"- Machine limits: not measured ({m.get('error', 'skipped')})."]
    blas = ", ".join(f"{b.get('internal_api')} {b.get('version')} ({b.get('architecture')})"
                     for b in m.get("blas", []))
    lines = [
        f"- Machine limits, measured at the start and the end of the run (best of the "
        f"{m.get('runs', 1)} kept):",
        f"  memory read bandwidth (numpy {m.get('read_method', 'sum')} over 2 GiB, median of 5) "
        f"{m['read_gbps_1t']:.1f} GB/s "
        f"with 1 thread, {m['read_gbps_2t']:.1f} GB/s with 2;",
        f"  fp32 matmul 2048^2 (numpy {m['numpy']}, {blas}) {m['matmul_fp32_gflops_1t']:.0f} / "
        f"{m['matmul_fp32_gflops_2t']:.0f} GFLOP/s with 1 / 2 threads.",
        f"- Single-stream decode bound: {m['weight_bytes_per_token'] / 1e6:.1f} MB of weights "
        f"read per token (the GGUF's tensor sizes: all read once per token, an untied token "
        f"embedding excepted) / {m.get('read_gbps_best', m['read_gbps_2t']):.1f} GB/s = "
        f"{m['decode_bound_tok_s']:.0f} tok/s (KV reads not counted).",
    ]
    for b in bound_fractions(record):
        lines.append(f"- {b['server']}, single stream: {b['decode_tok_s']:.1f} tok/s decode "
                     f"(1000 / median TPOT at c=1) = {100 * b['decode_fraction']:.1f}% of the "
                     f"bound; {b['output_tok_s']:.1f} output tok/s including prefill = "
                     f"{100 * b['output_fraction']:.1f}%.")
    return lines
