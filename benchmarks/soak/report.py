"""A markdown table of the soak runs in benchmarks/soak/results (one row per mode).

    python -m benchmarks.soak.report
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.soak.memory import target_met

RESULTS = Path(__file__).resolve().parent / "results"


def row(run: dict) -> str:
    s = run["summary"]
    budget = s.get("budget") or {}
    failed = s["requests_sent"] - s["requests_ok"]
    return " | ".join(str(x) for x in [
        f"`{run['mode']}`", f"`{run['commit']}`", f"{s['load_s'] / 60:.0f} min", run["clients"],
        f"{s['requests_ok']:,} / {s['requests_sent']:,}" + (f" ({failed} not ok)" if failed else ""),
        f"{s['output_tokens']:,}",
        f"{s['engine_mib_after_warmup']:,} -> {s['engine_mib_end']:,} (peak {s['engine_mib_peak']:,})",
        f"{s['engine_slope_mib_per_min']:+.2f}", f"{s['api_slope_mib_per_min']:+.2f}",
        f"{budget.get('budget', 0):.2f} GiB" if budget else "?",
        "yes" if target_met(s) else "no",
    ])


def main() -> int:
    runs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    header = ["mode", "commit", "load", "clients", "requests ok / sent", "output tokens",
              "engine RSS MiB: after warm-up -> end", "engine slope MiB/min",
              "API server slope MiB/min", "engine budget", "target met"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for run in runs:
        print(f"| {row(run)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
