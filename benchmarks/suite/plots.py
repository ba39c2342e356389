"""Draw throughput and median TTFT against concurrency, one line per server.

Run as `python -m benchmarks.suite.plots RUN.json OUT_DIR` in the bench tools venv
(matplotlib); RUN.json is one history.jsonl record. Writes serving_throughput.png and
serving_ttft.png into OUT_DIR.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")   # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def series(record: dict, key: str, scale: float = 1.0) -> dict[str, tuple[list[int], list[float]]]:
    """server -> (concurrencies, values * scale) over the levels that completed requests."""
    out = {}
    for server in record["servers"]:
        points = [(row["concurrency"], row[key] * scale) for row in server.get("levels", [])
                  if row.get("completed") and row.get(key) is not None]
        if points:
            out[server["server"]] = tuple(map(list, zip(*points)))
    return out


def draw(record: dict, key: str, ylabel: str, title: str, path: Path, log_y: bool,
         scale: float = 1.0) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    levels = sorted({row["concurrency"] for s in record["servers"] for row in s.get("levels", [])})
    for name, (xs, ys) in series(record, key, scale).items():
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log", base=2)
    if levels:
        ax.set_xticks(levels, [str(c) for c in levels])
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _p: f"{v:g}"))
    ax.set_xlabel("concurrency (--max-concurrency)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(run_json: Path, out_dir: Path) -> None:
    record = json.loads(run_json.read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    w = record["workload"]
    sub = (f"{w['input_len']} in / {w['output_len']} out, {record['timestamp'][:10]}, "
           f"{record['git_commit'][:8]}")
    draw(record, "output_tok_s", "output tokens/s", f"Output throughput ({sub})",
         out_dir / "serving_throughput.png", log_y=True)
    draw(record, "median_ttft_ms", "median TTFT (s)", f"Median time to first token ({sub})",
         out_dir / "serving_ttft.png", log_y=True, scale=1e-3)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m benchmarks.suite.plots RUN.json OUT_DIR")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
