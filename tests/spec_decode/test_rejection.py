"""The acceptance rule of speculative decoding against float64 numpy references.

verify (target distributions, draft probabilities, residual draws) on both sampler
paths, accept against a plain-Python statement of the rule, the emitted tokens'
distribution (chi-square), and seeded acceptance uniforms.
"""


import mlx.core as mx
import numpy as np
import pytest
from vllm import SamplingParams

from tests.sampling_reference import ref_filter, ref_log_softmax, ref_process
from vllm_metal.native import get_ops
from vllm_metal.spec_decode.rejection import accept, acceptance_uniforms, verify
from vllm_metal.v1.sampler import Sampler
from vllm_metal.v1.sampling_batch import RequestSamplingState, build_sampling_batch

KERNELS = pytest.mark.parametrize("cpu_kernel", [True, False], ids=["kernel", "gumbel"])


# ---------------------------------------------------------------- references

def ref_row(raw, st, bitmask_row=None):
    """(processed logits, target distribution p) of one verification row, float64."""
    processed = ref_process(raw, st.params, st.prompt_token_ids, st.output_token_ids,
                            bitmask_row)
    return processed, np.exp(ref_log_softmax(ref_filter(processed, st.params)))


def ref_accept(drafts, cu_rows, targets, draft_probs, greedy, uniforms):
    """The rule, one row at a time."""
    tokens, row_tokens, used = [], [0] * len(drafts), [False] * len(drafts)
    for r in range(len(cu_rows) - 1):
        start, end = int(cu_rows[r]), int(cu_rows[r + 1])
        out = []
        for j in range(start, end):
            used[j] = True
            d = int(drafts[j])
            if j == end - 1 or d < 0:
                ok = False
            elif greedy[j] or draft_probs is None:
                ok = int(targets[j]) == d
            else:
                ok = draft_probs[j] >= 1.0 or uniforms[j] < draft_probs[j]
            row_tokens[j] = d if ok else int(targets[j])
            out.append(row_tokens[j])
            if not ok:
                break
        tokens.append(out)
    return tokens, row_tokens, used


# ---------------------------------------------------------------- helpers

def state(prompt=(1, 2, 3), output=(), **kw):
    return RequestSamplingState(SamplingParams(**kw), list(prompt), list(output))


def layout(states, drafts):
    """Verification rows of requests with drafts (lists, -1 pads): each request's
    states extended by the drafts before each row, cu_rows and the row drafts."""
    cu_rows = np.concatenate([[0], np.cumsum([len(d) + 1 for d in drafts])]).astype(np.int64)
    row_drafts = np.concatenate([np.asarray(list(d) + [-1], np.int32) for d in drafts])
    rows = []
    for st, d in zip(states, drafts):
        reachable = d[:d.index(-1)] if -1 in d else d
        rows += [st.extended(list(reachable[:j])) for j in range(len(d) + 1)]
    return rows, cu_rows, row_drafts


def step(sampler, rows, cu_rows, row_drafts, logits, bitmask=None):
    """verify + acceptance_uniforms + accept, as a runner step does."""
    batch = build_sampling_batch(rows, sampler.vocab_size)
    verdict = verify(sampler, mx.array(logits, dtype=mx.float32), batch, row_drafts, bitmask)
    targets = np.array(verdict.targets)
    probs = None if verdict.draft_probs is None else np.array(verdict.draft_probs)
    uniforms = None if probs is None else acceptance_uniforms(batch, sampler.rng)
    return accept(row_drafts, cu_rows, targets, probs, batch.greedy, uniforms)


def chi2_critical(df, z=3.719):
    """Wilson-Hilferty quantile of chi-square(df) at upper tail ~1e-4."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def chi2(counts, probs):
    """Pearson statistic and df; bins expected below 5 are pooled (with the smallest
    other bin if the pool itself stays below 5)."""
    counts, probs = np.asarray(counts, np.float64), np.asarray(probs, np.float64)
    expected = probs / probs.sum() * counts.sum()
    big = expected >= 5
    obs, exp = list(counts[big]), list(expected[big])
    small = ~big
    if small.any():
        o, e = counts[small].sum(), expected[small].sum()
        if e < 5 and exp:
            i = int(np.argmin(exp))
            obs[i], exp[i] = obs[i] + o, exp[i] + e
        else:
            obs.append(o)
            exp.append(e)
    obs, exp = np.array(obs), np.array(exp)
    return ((obs - exp) ** 2 / exp).sum(), len(obs) - 1


def assert_follows(counts, probs, what):
    assert counts[probs == 0].sum() == 0, f"{what}: emitted a token of probability 0"
    stat, df = chi2(counts, probs)
    if df > 0:
        assert stat < chi2_critical(df), (what, counts.tolist(),
                                          (probs * counts.sum()).round(1).tolist())


def assert_binomial(successes, trials, p, what):
    sd = np.sqrt(trials * p * (1 - p))
    assert abs(successes - trials * p) <= 4.5 * sd + 1e-9, (what, successes, trials * p)


# ---------------------------------------------------------------- accept

def random_layout(rng, all_greedy):
    vocab = 6
    ks = rng.integers(0, 7, rng.integers(1, 9)).tolist()
    cu_rows = np.concatenate([[0], np.cumsum(np.array(ks) + 1)]).astype(np.int64)
    n = int(cu_rows[-1])
    drafts = rng.integers(0, vocab, n).astype(np.int32)
    drafts[rng.random(n) < 0.15] = -1
    drafts[cu_rows[1:] - 1] = -1  # bonus rows
    greedy = np.ones(n, bool) if all_greedy else rng.random(n) < 0.4
    targets = rng.integers(0, vocab, n).astype(np.int32)
    # Greedy rows agree with their draft often; sampled rows' targets avoid it.
    agree = greedy & (drafts >= 0) & (rng.random(n) < 0.7)
    targets[agree] = drafts[agree]
    clash = ~greedy & (targets == drafts)
    targets[clash] = (drafts[clash] + 1) % vocab
    if all_greedy:
        return drafts, cu_rows, targets, None, greedy, None
    kind = rng.integers(0, 4, n)
    probs = np.select([kind == 0, kind == 1], [0.0, 1.0], rng.random(n)).astype(np.float32)
    probs[drafts < 0] = 0.0
    uniforms = rng.random(n)
    tie = rng.random(n) < 0.15
    uniforms[tie] = probs[tie]  # u == p refuses
    uniforms[rng.random(n) < 0.05] = 0.0
    return drafts, cu_rows, targets, probs, greedy, uniforms


@pytest.mark.parametrize("all_greedy", [False, True])
def test_accept_matches_the_rule_on_random_layouts(all_greedy):
    rng = np.random.default_rng(7)
    for _ in range(400):
        args = random_layout(rng, all_greedy)
        got = accept(*args)
        tokens, row_tokens, used = ref_accept(*args)
        assert got.tokens == tokens, args
        assert got.row_tokens.tolist() == row_tokens
        assert got.used.tolist() == used
        assert got.row_tokens.dtype == np.int32 and got.used.dtype == bool
        # Each request emits its accepted prefix and exactly one token more.
        cu_rows = args[1]
        assert [len(t) for t in got.tokens] == [
            int(got.used[a:b].sum()) for a, b in zip(cu_rows[:-1], cu_rows[1:])]


def test_accept_edge_probabilities():
    drafts = np.array([3, 4, -1, 3, 4, -1, 5, -1, 2, -1], np.int32)
    cu_rows = np.array([0, 3, 6, 8, 10])
    targets = np.array([7, 8, 9, 7, 8, 9, 1, 6, 2, 0], np.int32)
    greedy = np.array([False] * 8 + [True, True])
    # p = 1 is accepted even at u just below 1; p = 0 refused even at u = 0; u == p refuses.
    probs = np.array([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.25, 0.0, 0.0, 0.0], np.float32)
    uniforms = np.array([0.9999999, 0.5, 0.3, 0.0, 0.1, 0.2, 0.25, 0.0, 0.9, 0.9])
    got = accept(drafts, cu_rows, targets, probs, greedy, uniforms)
    assert got.tokens == ref_accept(drafts, cu_rows, targets, probs, greedy, uniforms)[0]
    assert got.tokens == [[3, 4, 9], [7], [1], [2, 0]]


def test_accept_of_nothing():
    got = accept(np.zeros(0, np.int32), np.array([0]), np.zeros(0, np.int32), None,
                 np.zeros(0, bool), None)
    assert got.tokens == [] and got.row_tokens.shape == (0,) and got.used.shape == (0,)


# ---------------------------------------------------------------- verify

VOCAB = 40
ROW_PARAMS = [
    dict(temperature=0.0),
    dict(temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.4),
    dict(temperature=0.0, _bad_words_token_ids=[[5], [7, 9]], logit_bias={12: 2.5}),
    dict(temperature=0.7),
    dict(temperature=1.2, top_k=6),
    dict(temperature=0.9, top_p=0.7),
    dict(temperature=1.0, min_p=0.1, top_k=15, top_p=0.9, seed=3),
    dict(temperature=0.6, presence_penalty=0.8, logit_bias={4: 3.0}),
    dict(temperature=1.5, allowed_token_ids=[0, 3, 5, 8, 13, 21, 34], seed=9),
    dict(temperature=0.8, _bad_words_token_ids=[[2], [1, 6]], min_tokens=5,
         stop_token_ids=[11]),
    dict(temperature=1.0, top_k=1),
]


def random_rows(rng, num_rows, params=ROW_PARAMS):
    rows = []
    for _ in range(num_rows):
        p = params[rng.integers(len(params))]
        prompt = rng.integers(0, VOCAB, rng.integers(1, 6)).tolist()
        output = rng.integers(0, 8, rng.integers(0, 6)).tolist()
        rows.append(state(prompt, output, **p))
    return rows


def random_bitmask(rng, num_rows):
    bits = (rng.random((num_rows, 64)) < 0.5).astype(np.uint64)
    bits[:, :8] = 1  # every row keeps some tokens whatever else masks it
    bits[rng.random(num_rows) < 0.3] = 1  # rows without a grammar
    words = (bits.reshape(num_rows, 2, 32) << np.arange(32, dtype=np.uint64)).sum(-1)
    return words.astype(np.uint32).view(np.int32)


def pick_drafts(rng, refs):
    """Per row: none, the most likely token, a random token, or a filtered-out one."""
    drafts = []
    for _, p in refs:
        kind = rng.integers(4)
        out = np.flatnonzero(p == 0)
        if kind == 0:
            drafts.append(-1)
        elif kind == 1:
            drafts.append(int(np.argmax(p)))
        elif kind == 2 or not len(out):
            drafts.append(int(rng.integers(VOCAB)))
        else:
            drafts.append(int(rng.choice(out)))
    return np.array(drafts, np.int32)


@KERNELS
@pytest.mark.parametrize("grammar", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_verify_matches_the_reference(seed, grammar, cpu_kernel):
    rng = np.random.default_rng(seed)
    rows = random_rows(rng, 48)
    logits = rng.normal(0, 2, (48, VOCAB)).astype(np.float32)
    bitmask = random_bitmask(rng, 48) if grammar else None
    refs = [ref_row(logits[i], st, None if bitmask is None else bitmask[i])
            for i, st in enumerate(rows)]
    drafts = pick_drafts(rng, refs)
    batch = build_sampling_batch(rows, VOCAB)
    assert not batch.all_greedy and batch.greedy.any()
    mx.random.seed(seed)
    verdict = verify(Sampler(VOCAB, cpu_kernel=cpu_kernel), mx.array(logits), batch, drafts,
                     bitmask)
    targets, probs = np.array(verdict.targets), np.array(verdict.draft_probs)
    assert targets.dtype == np.int32 and probs.dtype == np.float32
    assert targets.shape == probs.shape == (48,)
    want_probs = np.array([p[d] if d >= 0 else 0.0 for d, (_, p) in zip(drafts, refs)])
    np.testing.assert_allclose(probs, want_probs, rtol=1e-4, atol=1e-5)
    for i, (processed, p) in enumerate(refs):
        if batch.greedy[i]:
            assert targets[i] == np.argmax(processed), i
            continue
        if drafts[i] >= 0 and p[drafts[i]] == 1:
            continue  # always accepted: nothing left to draw the target from
        assert p[targets[i]] > 0, (i, targets[i])  # drawn from the row's support
        assert targets[i] != drafts[i], i
    np.testing.assert_array_equal(np.array(verdict.scores), logits)  # raw_logprobs mode


@KERNELS
@pytest.mark.parametrize("processors", [False, True])
@pytest.mark.parametrize("grammar", [False, True])
def test_verify_all_greedy_rows_take_the_processed_argmax(grammar, processors, cpu_kernel):
    rng = np.random.default_rng(11)
    params = ROW_PARAMS[:3] if processors else ROW_PARAMS[:1]
    rows = random_rows(rng, 20, params)
    logits = rng.normal(0, 2, (20, VOCAB)).astype(np.float32)
    bitmask = random_bitmask(rng, 20) if grammar else None
    processed = [ref_row(logits[i], st, None if bitmask is None else bitmask[i])[0]
                 for i, st in enumerate(rows)]
    argmax = np.array([np.argmax(x) for x in processed], np.int32)
    drafts = np.where(rng.random(20) < 0.5, argmax, rng.integers(0, VOCAB, 20))
    drafts = np.where(rng.random(20) < 0.2, -1, drafts).astype(np.int32)
    batch = build_sampling_batch(rows, VOCAB)
    assert batch.all_greedy and batch.unprocessed != processors
    verdict = verify(Sampler(VOCAB, cpu_kernel=cpu_kernel), mx.array(logits), batch, drafts,
                     bitmask)
    assert verdict.draft_probs is None
    targets = np.array(verdict.targets)
    np.testing.assert_array_equal(targets, argmax)
    # Read as ten requests of one draft each (a draft row, then a bonus row).
    cu_rows = np.arange(0, 21, 2)
    got = accept(drafts, cu_rows, targets, None, batch.greedy, None)
    assert got.tokens == ref_accept(drafts, cu_rows, targets, None, batch.greedy, None)[0]


@KERNELS
@pytest.mark.parametrize("mode", ["raw_logprobs", "raw_logits", "processed_logits",
                                  "processed_logprobs"])
def test_verify_scores_follow_the_logprobs_mode(mode, cpu_kernel):
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 2, (4, VOCAB)).astype(np.float32)
    rows = [state(output=[4, 4], temperature=0.0, logprobs=2, presence_penalty=1.0),
            state(temperature=0.8, top_k=5, logprobs=2),
            state(temperature=1.2, top_p=0.6, seed=4, logprobs=1),
            state(temperature=0.0, logprobs=3)]
    batch = build_sampling_batch(rows, VOCAB)
    drafts = np.array([1, 2, -1, 3], np.int32)
    verdict = verify(Sampler(VOCAB, mode, cpu_kernel=cpu_kernel), mx.array(logits), batch,
                     drafts)
    scores = np.array(verdict.scores)
    if mode.startswith("raw"):
        np.testing.assert_array_equal(scores, logits)
        return
    for i, st in enumerate(rows):
        want = ref_filter(ref_row(logits[i], st)[0], st.params)
        assert np.array_equal(np.isneginf(scores[i]), np.isneginf(want)), i
        fin = np.isfinite(want)
        np.testing.assert_allclose(scores[i][fin], want[fin], rtol=2e-5, atol=2e-5)


@KERNELS
def test_verify_never_picks_columns_past_the_vocab(cpu_kernel):
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 1, (6, VOCAB + 8)).astype(np.float32)
    logits[:, VOCAB:] = 50.0  # padded lm_head columns
    rows = [state(temperature=0.0), state(temperature=0.9), state(temperature=1.3, top_p=0.9)] * 2
    drafts = np.array([VOCAB - 1, 0, 5, -1, -1, 3], np.int32)
    batch = build_sampling_batch(rows, VOCAB)
    verdict = verify(Sampler(VOCAB, cpu_kernel=cpu_kernel), mx.array(logits), batch, drafts)
    targets, probs = np.array(verdict.targets), np.array(verdict.draft_probs)
    assert (targets < VOCAB).all()
    np.testing.assert_array_equal(targets[::3], np.argmax(logits[::3, :VOCAB], axis=-1))
    for i, st in enumerate(rows):
        if drafts[i] >= 0:
            want = ref_row(logits[i, :VOCAB], st)[1][drafts[i]]
            assert probs[i] == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert verdict.scores.shape == (6, VOCAB)


# ---------------------------------------------------------------- distribution

DIST_VOCAB = 10
DIST_LOGITS = np.array([
    [2.0, 1.5, 1.0, 0.6, 0.3, 0.0, -0.5, -1.0, -1.5, -2.5],
    [0.2, 1.8, -0.4, 1.1, 0.9, -1.2, 0.0, 0.5, -2.0, 1.4],
    [1.0, -0.3, 0.4, 2.2, -1.0, 0.8, 0.1, -0.6, 1.6, -2.2],
], np.float32)
DIST_CASES = {
    "temperature": dict(temperature=0.8),
    "top_k": dict(temperature=1.3, top_k=5),
    "top_p_min_p": dict(temperature=1.0, top_p=0.8, min_p=0.05),
    # Row 1 sees d_0 in its history: penalties and a bad word [0, 3] move p_1.
    "history": dict(temperature=1.1, repetition_penalty=1.3, frequency_penalty=0.6,
                    presence_penalty=0.4, _bad_words_token_ids=[[0, 3]]),
}


def dist_draft(p, kind):
    if kind == "likely":
        return int(np.argmax(p))
    if kind == "unlikely":  # the least likely token still seen often enough to condition on
        return int(np.flatnonzero(p >= 0.02)[np.argmin(p[p >= 0.02])])
    return int(np.flatnonzero(p == 0)[0])


@KERNELS
@pytest.mark.parametrize("case, kind, seeded", [
    ("temperature", "likely", False), ("temperature", "unlikely", False),
    ("top_k", "likely", False), ("top_k", "unlikely", False), ("top_k", "filtered", False),
    ("top_p_min_p", "likely", False), ("top_p_min_p", "filtered", False),
    ("history", "likely", False), ("history", "unlikely", False),
    ("top_k", "likely", True), ("history", "likely", True),
])
def test_emitted_tokens_follow_the_target_distribution(case, kind, seeded, cpu_kernel):
    requests = 6000
    params = SamplingParams(**DIST_CASES[case])
    base = RequestSamplingState(params, [1, 2])
    _, p0 = ref_row(DIST_LOGITS[0], base)
    d0 = dist_draft(p0, kind)
    _, p1 = ref_row(DIST_LOGITS[1], base.extended([d0]))
    d1 = int(np.argmax(p1))
    _, p2 = ref_row(DIST_LOGITS[2], base.extended([d0, d1]))
    if case == "history" and kind == "likely":
        assert d0 == 0 and p1[3] == 0  # the bad word bites on row 1 only
    states = [RequestSamplingState(params, [1, 2], generator_seed=i if seeded else None)
              for i in range(requests)]
    rows, cu_rows, row_drafts = layout(states, [[d0, d1]] * requests)
    logits = np.tile(DIST_LOGITS, (requests, 1))
    mx.random.seed(17)
    sampler = Sampler(DIST_VOCAB, cpu_kernel=cpu_kernel)
    tokens = step(sampler, rows, cu_rows, row_drafts, logits).tokens

    first = np.array([t[0] for t in tokens])
    assert [len(t) > 1 for t in tokens] == (first == d0).tolist()  # refusals never emit d_0
    counts = np.bincount(first, minlength=DIST_VOCAB)
    assert_follows(counts, p0, "first token")
    assert_binomial(counts[d0], requests, p0[d0], "d_0 accepted")
    if kind == "likely":
        # The test has power: refusals that could re-draw d_0 are told apart.
        wrong = (1 - p0[d0]) * p0
        wrong[d0] += p0[d0]
        assert chi2(counts, wrong)[0] > chi2_critical(chi2(counts, wrong)[1])

    after_d0 = [t for t in tokens if len(t) > 1]
    if kind == "filtered":
        assert not after_d0
        return
    second = np.array([t[1] for t in after_d0])
    counts = np.bincount(second, minlength=DIST_VOCAB)
    assert_follows(counts, p1, "second token after d_0")
    assert_binomial(counts[d1], len(after_d0), p1[d1], "d_1 accepted")
    bonus = np.array([t[2] for t in after_d0 if len(t) > 2])
    assert len(bonus) == counts[d1]
    if len(bonus) >= 200:
        assert_follows(np.bincount(bonus, minlength=DIST_VOCAB), p2, "bonus token")


# ---------------------------------------------------------------- seeded uniforms

def test_seeded_uniforms_depend_on_seed_and_step_only():
    vocab = 16
    seeded = dict(seed=77, temperature=0.9)

    def uniform(others, at, steps, rng_seed):
        rng = np.random.default_rng(rng_seed)
        rows = [state(output=[1] * int(rng.integers(0, 5)), temperature=0.8)
                for _ in range(others)]
        rows.insert(at, state(output=[4] * steps, **seeded))
        u = acceptance_uniforms(build_sampling_batch(rows, vocab), rng)
        assert u.dtype == np.float64 and u.shape == (others + 1,)
        assert ((u >= 0) & (u < 1)).all()
        return u[at]

    first = uniform(0, 0, 3, 0)
    assert uniform(5, 3, 3, 1) == first
    assert uniform(2, 2, 3, 2) == first
    assert len({uniform(1, 0, s, 3) for s in range(6)}) == 6  # a new step, a new uniform
    other = state(output=[4] * 3, **{**seeded, "seed": 78})
    assert acceptance_uniforms(build_sampling_batch([other], vocab),
                               np.random.default_rng(0))[0] != first

    # The rows of one request: each row its own step.
    rows, _, _ = layout([state(**seeded)], [[3, 5, 7]])
    u = acceptance_uniforms(build_sampling_batch(rows, vocab), np.random.default_rng(0))
    assert len(set(u.tolist())) == 4
    # Row j is step j whatever the tokens before it were.
    assert u.tolist() == [uniform(0, 0, s, 9) for s in range(4)]


def test_unseeded_uniforms_come_from_the_rng():
    rows = [state(temperature=0.7), state(temperature=0.9, seed=5), state(temperature=0.0),
            state(temperature=1.0)] * 50
    batch = build_sampling_batch(rows, 16)
    unseeded = ~batch.seeded_rows
    a = acceptance_uniforms(batch, np.random.default_rng(1))
    b = acceptance_uniforms(batch, np.random.default_rng(1))
    rng = np.random.default_rng(2)
    c = acceptance_uniforms(batch, rng)
    d = acceptance_uniforms(batch, rng)  # the generator advanced
    np.testing.assert_array_equal(a, b)
    assert (a[unseeded] != c[unseeded]).all() and (c[unseeded] != d[unseeded]).all()
    np.testing.assert_array_equal(a[~unseeded], c[~unseeded])
    np.testing.assert_array_equal(c[~unseeded], d[~unseeded])
    assert ((a >= 0) & (a < 1)).all()
    assert len(set(a[unseeded].tolist())) == unseeded.sum()


def test_seeded_uniforms_are_uniform_and_apart_from_the_draw():
    n = 4000
    rows = [state(temperature=1.0, seed=s) for s in range(n)]
    batch = build_sampling_batch(rows, 16)
    u = acceptance_uniforms(batch, np.random.default_rng(0))
    assert ((u >= 0) & (u < 1)).all()
    stat, df = chi2(np.bincount((u * 20).astype(int), minlength=20), np.full(20, 0.05))
    assert stat < chi2_critical(df)
    # Not the kernel's draw uniform of the same key, nor correlated with it: a refusal's
    # draw must not depend on the acceptance test that refused.
    key_uniform = get_ops().debug.key_uniform
    draw = np.array([key_uniform(int(hi), int(lo)) for hi, lo in batch.seeded_keys])
    assert not np.isclose(u, draw).any()
    assert abs(np.corrcoef(u, draw)[0, 1]) < 4 / np.sqrt(n)


@KERNELS
def test_a_seeded_request_verifies_alike_in_any_batch(cpu_kernel):
    vocab = 32
    rng = np.random.default_rng(8)
    mine = state(output=[2, 5], temperature=0.9, top_p=0.95, seed=1234)
    drafts = [4, 4, 9]
    my_logits = rng.normal(0, 0.3, (4, vocab)).astype(np.float32)
    my_logits[:, 4] += 1.0  # drafts likely enough that some are accepted, some refused

    def run(before, after):
        others = [state(output=[1], temperature=0.8) for _ in range(before + after)]
        other_drafts = [[int(t) for t in rng.integers(0, vocab, rng.integers(0, 3))]
                        for _ in others]
        states = others[:before] + [mine] + others[before:]
        all_drafts = other_drafts[:before] + [drafts] + other_drafts[before:]
        rows, cu_rows, row_drafts = layout(states, all_drafts)
        logits = rng.normal(0, 1, (len(rows), vocab)).astype(np.float32)
        logits[cu_rows[before]:cu_rows[before + 1]] = my_logits
        sampler = Sampler(vocab, cpu_kernel=cpu_kernel)
        return step(sampler, rows, cu_rows, row_drafts, logits).tokens[before]

    first = run(0, 0)
    assert run(3, 2) == first and run(1, 4) == first
    results = {tuple(first)}
    for seed in range(1235, 1245):
        other = state(output=[2, 5], temperature=0.9, top_p=0.95, seed=seed)
        rows, cu_rows, row_drafts = layout([other], [drafts])
        results.add(tuple(step(Sampler(vocab, cpu_kernel=cpu_kernel), rows, cu_rows,
                               row_drafts, my_logits).tokens[0]))
    assert len(results) > 1  # the seed matters


# ---------------------------------------------------------------- errors

def test_verify_rejects_mismatched_rows():
    sampler = Sampler(VOCAB)
    batch = build_sampling_batch([state(), state(temperature=0.0)], VOCAB)
    logits = mx.zeros((2, VOCAB))
    with pytest.raises(ValueError, match="must agree"):
        verify(sampler, mx.zeros((3, VOCAB)), batch, np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="must agree"):
        verify(sampler, logits, batch, np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="must agree"):
        verify(sampler, logits, batch, np.zeros((2, 1), np.int32))
    greedy = build_sampling_batch([state(temperature=0.0)] * 3, VOCAB)
    with pytest.raises(ValueError, match="must agree"):
        verify(sampler, logits, greedy, np.zeros(2, np.int32))


def test_accept_rejects_mismatched_arrays():
    drafts = np.array([1, 2, -1], np.int32)
    with pytest.raises(ValueError):
        accept(drafts, np.array([0, 3]), np.array([1, 2]), None, np.ones(3, bool), None)
    with pytest.raises(ValueError):
        accept(drafts, np.array([0, 3]), np.array([1, 2, 3]), np.array([0.5, 0.5]),
               np.zeros(3, bool), np.array([0.1, 0.2, 0.3]))


@pytest.mark.parametrize("cu_rows", [[0, 2], [0, 5], [0, 1, 2, 3, 4], [1, 3], [0, 2, 2, 3]])
def test_accept_rejects_cu_rows_that_do_not_cover_the_rows(cu_rows):
    drafts = np.array([1, 2, -1], np.int32)
    with pytest.raises(ValueError):
        accept(drafts, np.array(cu_rows), np.array([1, 2, 3], np.int32), None,
               np.ones(3, bool), None)
