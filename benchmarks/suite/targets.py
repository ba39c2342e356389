"""Issue 24's performance targets, judged from one run's measurements.

The inputs are what the benchmark commands already produce: a serving-suite record
(`run_suite`) for SmolLM2 and one for TinyLlama's shape, `bench_long_context` rows for
the long prompt and contexts, and the 8B shape's single-stream decode with the bound
measured beside it. Each target comes out met, missed, or not measured (a server or a
level that did not finish): never guessed from a neighbour.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.suite.tables import level_row

PEER = "llama-server"


@dataclass(frozen=True)
class Verdict:
    target: str          # the target in words, with its threshold
    measured: str        # the figure, or why there is none
    met: bool | None     # None: not measured

    def row(self) -> str:
        mark = {True: "yes", False: "no", None: "not measured"}[self.met]
        return f"| {self.target} | {self.measured} | {mark} |"


def _finished(server: dict | None, c: int) -> dict | None:
    row = level_row(server, c) if server else None
    return row if row and row.get("completed") and row.get("output_tok_s") else None


def _server(record: dict | None, name: str) -> dict | None:
    if not record:
        return None
    return next((s for s in record.get("servers", []) if s["server"] == name), None)


def _at_least(target: str, value: float | None, floor: float, text: str) -> Verdict:
    if value is None:
        return Verdict(target, text, None)
    return Verdict(target, text, value >= floor)


def speedup(record: dict | None, shape: str, c: int, floor: float) -> Verdict:
    """ours over llama-server, output tok/s at concurrency c (a time-capped level still
    gives a rate: the tokens of the requests it ran over their time)."""
    target = f"{shape} c={c} output tok/s >= {floor:g}x {PEER}'s"
    ours = _finished(_server(record, "ours"), c)
    peer = _finished(_server(record, PEER), c)
    if not (ours and peer):
        missing = "ours" if not ours else PEER
        return Verdict(target, f"{missing} did not finish c={c}", None)
    ratio = ours["output_tok_s"] / peer["output_tok_s"]
    text = f"{ours['output_tok_s']:.1f} / {peer['output_tok_s']:.1f} = {ratio:.2f}x"
    return _at_least(target, ratio, floor, text)


def ttft_below_peers(record: dict | None, shape: str, c: int) -> Verdict:
    """ours' median TTFT at c below every other server's that finished the level."""
    target = f"{shape} c={c} median TTFT below every peer's"
    ours = _finished(_server(record, "ours"), c)
    peers = [(s["server"], _finished(s, c)) for s in (record or {}).get("servers", [])
             if not s["server"].startswith("ours")]
    peers = [(name, row) for name, row in peers if row and row.get("median_ttft_ms")]
    if not (ours and ours.get("median_ttft_ms") and peers):
        return Verdict(target, "ours or every peer did not finish", None)
    best_name, best = min(peers, key=lambda p: p[1]["median_ttft_ms"])
    text = (f"{ours['median_ttft_ms'] / 1000:.2f} s vs {best['median_ttft_ms'] / 1000:.2f} s "
            f"({best_name}, the fastest peer)")
    return Verdict(target, text, ours["median_ttft_ms"] < best["median_ttft_ms"])


def decode_of_bound(record: dict | None, shape: str, floor: float) -> Verdict:
    """ours' single-stream decode (1000 / median TPOT at c=1) over the run's bound."""
    target = f"{shape} single-stream decode >= {floor:.0%} of the bandwidth bound"
    row = next((r for r in (record or {}).get("ours_vs_bound", []) if r["server"] == "ours"),
               None)
    if row is None:
        return Verdict(target, "no c=1 level or no bound", None)
    bound = row["decode_tok_s"] / row["decode_fraction"]
    text = f"{row['decode_tok_s']:.1f} of {bound:.0f} tok/s = {row['decode_fraction']:.1%}"
    return _at_least(target, row["decode_fraction"], floor, text)


def _long_row(rows: list[dict], server: str) -> dict | None:
    return next((r for r in rows if r.get("server") == server), None)


def long_prompt_ttft(rows: list[dict], prompt: int, ceiling: float) -> Verdict:
    target = f"{prompt}-token prompt TTFT <= {ceiling:g}x {PEER}'s"
    ours, peer = _long_row(rows, "ours"), _long_row(rows, PEER)
    if not (ours and peer):
        return Verdict(target, "ours or llama-server did not run", None)
    ratio = ours["ttft_s"] / peer["ttft_s"]
    text = f"{ours['ttft_s']:.2f} / {peer['ttft_s']:.2f} s = {ratio:.2f}x"
    return Verdict(target, text, ratio <= ceiling)


def long_context_decode(rows: list[dict], short: int, long: int, floor: float) -> Verdict:
    target = f"decode at {long} tokens of context >= {floor:g}x decode at {short}"
    ours = _long_row(rows, "ours")
    if not (ours and ours.get(f"decode_{short}") and ours.get(f"decode_{long}")):
        return Verdict(target, "ours did not run both contexts", None)
    ratio = ours[f"decode_{long}"] / ours[f"decode_{short}"]
    text = f"{ours[f'decode_{long}']:.1f} / {ours[f'decode_{short}']:.1f} tok/s = {ratio:.3f}"
    return _at_least(target, ratio, floor, text)


def big_decode(decode_tok_s: float | None, weight_bytes: int, read_gbps: float, shape: str,
               floor: float) -> Verdict:
    """Single-stream decode of a shape served alone, against weight bytes / bandwidth."""
    target = f"{shape} single-stream decode >= {floor:.0%} of the bandwidth bound"
    if not decode_tok_s:
        return Verdict(target, "ours did not run", None)
    bound = read_gbps * 1e9 / weight_bytes
    fraction = decode_tok_s / bound
    text = (f"{decode_tok_s:.2f} of {bound:.2f} tok/s ({weight_bytes / 1e9:.2f} GB at "
            f"{read_gbps:.1f} GB/s) = {fraction:.1%}")
    return _at_least(target, fraction, floor, text)


def issue_24(smol: dict | None, tiny: dict | None, long_rows: list[dict], big: dict | None,
             prompt: int = 4096, short: int = 512, long: int = 8192) -> list[Verdict]:
    """Every target, in the issue's order. big: {"decode_tok_s", "weight_bytes",
    "read_gbps"} of the 8B shape (None: not run)."""
    out = [
        speedup(smol, "SmolLM2", 1, 3.0),
        speedup(smol, "SmolLM2", 16, 5.0),
        ttft_below_peers(smol, "SmolLM2", 16),
        decode_of_bound(smol, "SmolLM2", 0.75),
        speedup(tiny, "1.1B", 1, 1.5),
        speedup(tiny, "1.1B", 16, 3.0),
        long_prompt_ttft(long_rows, prompt, 0.5),
        long_context_decode(long_rows, short, long, 0.7),
    ]
    if big is None:
        out.append(Verdict("8B single-stream decode >= 80% of the bandwidth bound",
                           "not run", None))
    else:
        out.append(big_decode(big.get("decode_tok_s"), big["weight_bytes"], big["read_gbps"],
                              "8B", 0.80))
    return out


def table(verdicts: list[Verdict]) -> str:
    lines = ["| target (issue 24) | measured | met |", "|---|---|---|"]
    return "\n".join(lines + [v.row() for v in verdicts])
