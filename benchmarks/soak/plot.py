"""Draw a soak run's resident memory against time.

Run as `python -m benchmarks.soak.plot RUN.json OUT.png` where matplotlib is installed
(the suite's tools venv).
"""

from __future__ import annotations

import json
import sys

MiB = 2**20


def main(run_json: str, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = json.loads(open(run_json).read())
    t = [s["t"] / 60 for s in run["samples"]]
    fig, ax = plt.subplots(figsize=(8, 4))
    for key, label in (("total", "server (all processes)"), ("engine", "engine core"),
                       ("api", "API server")):
        ax.plot(t, [s[key] / MiB for s in run["samples"]], label=label)
    ax.axvline(run["warmup_s"] / 60, color="grey", linestyle=":", label="end of warm-up")
    summary = run["summary"]
    ax.set_title(f"Soak, {run['mode']} mode: {summary['output_tokens']:,} output tokens; "
                 f"engine slope {summary['engine_slope_mib_per_min']:+.2f} MiB/min")
    ax.set_xlabel("minutes")
    ax.set_ylabel("resident memory (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
