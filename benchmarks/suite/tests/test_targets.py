"""Issue 24's verdicts from run records: each target met, missed or not measured, with
the figure it was judged on (records shaped as run_suite writes them)."""

from __future__ import annotations

import pytest

from benchmarks.suite import targets


def level(c: int, tok_s: float | None, ttft_ms: float = 1000.0, tpot_ms: float = 5.0,
          completed: int = 8, capped: bool = False) -> dict:
    return {"concurrency": c, "completed": completed, "output_tok_s": tok_s,
            "median_ttft_ms": ttft_ms, "median_tpot_ms": tpot_ms, "capped": capped}


def record(ours: list[dict], peer: list[dict], bound: float | None = 300.0,
           decode: float = 250.0) -> dict:
    rec = {"servers": [{"server": "ours", "levels": ours},
                       {"server": "ours-exact", "levels": [level(16, 1.0, ttft_ms=1.0)]},
                       {"server": "llama-server", "levels": peer}]}
    rec["ours_vs_bound"] = [] if bound is None else [
        {"server": "ours", "decode_tok_s": decode, "decode_fraction": decode / bound}]
    return rec


def test_speedup_is_ours_over_llama_server_at_the_level():
    rec = record([level(1, 90.0), level(16, 400.0)], [level(1, 30.0), level(16, 100.0)])
    at1 = targets.speedup(rec, "SmolLM2", 1, 3.0)
    at16 = targets.speedup(rec, "SmolLM2", 16, 5.0)
    assert at1.met is True and "3.00x" in at1.measured
    assert at16.met is False and "4.00x" in at16.measured


def test_a_time_capped_peer_level_still_gives_a_rate():
    rec = record([level(16, 111.4)], [level(16, 30.7, completed=32, capped=True)])
    v = targets.speedup(rec, "1.1B", 16, 3.0)
    assert v.met is True and "3.63x" in v.measured


@pytest.mark.parametrize("peer", [[], [level(16, None)], [level(16, 50.0, completed=0)]])
def test_a_level_that_did_not_finish_is_not_measured(peer):
    v = targets.speedup(record([level(16, 400.0)], peer), "SmolLM2", 16, 5.0)
    assert v.met is None and "llama-server did not finish" in v.measured


def test_ttft_is_judged_against_the_fastest_peer_not_against_ours_exact():
    rec = record([level(16, 400.0, ttft_ms=1440.0)], [level(16, 65.0, ttft_ms=14600.0)])
    v = targets.ttft_below_peers(rec, "SmolLM2", 16)
    assert v.met is True and "1.44 s vs 14.60 s (llama-server" in v.measured
    slow = record([level(16, 400.0, ttft_ms=15000.0)], [level(16, 65.0, ttft_ms=14600.0)])
    assert targets.ttft_below_peers(slow, "SmolLM2", 16).met is False


def test_decode_of_bound_uses_the_runs_own_bound():
    assert targets.decode_of_bound(record([], [], bound=280.0, decode=287.7), "S", 0.75).met
    low = targets.decode_of_bound(record([], [], bound=400.0, decode=250.0), "S", 0.75)
    assert low.met is False and "62.5%" in low.measured
    assert targets.decode_of_bound(record([], [], bound=None), "S", 0.75).met is None


def test_long_prompt_and_long_context():
    rows = [{"server": "llama-server", "ttft_s": 54.24, "decode_512": 20.6, "decode_8192": 5.5},
            {"server": "ours", "ttft_s": 18.21, "decode_512": 38.9, "decode_8192": 27.0}]
    ttft = targets.long_prompt_ttft(rows, 4096, 0.5)
    assert ttft.met is True and "0.34x" in ttft.measured
    decode = targets.long_context_decode(rows, 512, 8192, 0.7)
    assert decode.met is False and "0.694" in decode.measured
    assert targets.long_prompt_ttft(rows[1:], 4096, 0.5).met is None


def test_big_decode_bound_is_weight_bytes_over_bandwidth():
    v = targets.big_decode(5.86, 4_040_000_000, 31.3, "8B", 0.80)
    assert v.met is False and "7.75 tok/s" in v.measured and "75.6%" in v.measured
    assert targets.big_decode(6.4, 4_040_000_000, 31.3, "8B", 0.80).met is True
    assert targets.big_decode(None, 4_040_000_000, 31.3, "8B", 0.80).met is None


def test_issue_24_lists_every_target_once_in_order():
    rec = record([level(1, 229.1), level(16, 399.5, ttft_ms=1440.0)],
                 [level(1, 54.1), level(16, 65.3, ttft_ms=14600.0)], bound=280.0, decode=287.7)
    verdicts = targets.issue_24(rec, None, [], None)
    assert len(verdicts) == 9
    assert [v.met for v in verdicts[:4]] == [True, True, True, True]
    assert all(v.met is None for v in verdicts[4:])
    text = targets.table(verdicts)
    assert text.count("\n") == 10 and text.count("| not measured |") == 5
