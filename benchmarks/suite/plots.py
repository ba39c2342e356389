"""Draw throughput and median TTFT against concurrency, one line per server.

Run as `python -m benchmarks.suite.plots RUN.json OUT_DIR` in the bench tools venv
(matplotlib); RUN.json is one history.jsonl record. Writes serving_throughput.png and
serving_ttft.png into OUT_DIR. Time-capped levels are drawn hollow.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PLOTS = (  # (row key, y label, title, file, scale)
    ("output_tok_s", "output tokens/s", "Output throughput", "serving_throughput.png", 1.0),
    ("median_ttft_ms", "median TTFT (s)", "Median time to first token", "serving_ttft.png", 1e-3),
)


def series(record: dict, key: str, scale: float = 1.0) -> dict[str, list[tuple[int, float, bool]]]:
    """server -> [(concurrency, value * scale, capped)] over the levels that completed requests."""
    out = {}
    for server in record["servers"]:
        points = [(row["concurrency"], row[key] * scale, bool(row.get("capped")))
                  for row in server.get("levels", [])
                  if row.get("completed") and row.get(key) is not None]
        if points:
            out[server["server"]] = points
    return out


def draw(record: dict, key: str, ylabel: str, title: str, path: Path, scale: float) -> None:
    import matplotlib

    matplotlib.use("Agg")   # files only, no display
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    levels = sorted({row["concurrency"] for s in record["servers"] for row in s.get("levels", [])})
    any_capped = False
    for name, points in series(record, key, scale).items():
        xs, ys, _capped = zip(*points)
        (line,) = ax.plot(xs, ys, marker="o", label=name)
        hollow = [(x, y) for x, y, c in points if c]
        if hollow:
            any_capped = True
            ax.plot(*zip(*hollow), linestyle="none", marker="o", markersize=9,
                    markerfacecolor="white", markeredgecolor=line.get_color())
    ax.set_xscale("log", base=2)
    if levels:
        ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _p: f"{v:g}"))
    ax.set_xlabel("concurrency (--max-concurrency)"
                  + ("; hollow: time-capped level" if any_capped else ""))
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
    for key, ylabel, title, name, scale in PLOTS:
        draw(record, key, ylabel, f"{title} ({sub})", out_dir / name, scale)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m benchmarks.suite.plots RUN.json OUT_DIR")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
