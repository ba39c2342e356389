"""The MLX sampler against a per-row numpy float64 reference of vLLM's semantics."""


import mlx.core as mx
import numpy as np
import pytest
from vllm import SamplingParams

from tests.sampling_reference import ref_filter, ref_log_softmax, ref_process
from vllm_metal.v1 import logits_processing
from vllm_metal.v1.sampler import Sampler, compute_prompt_logprobs
from vllm_metal.v1.sampling_batch import RequestSamplingState, build_sampling_batch



# ---------------------------------------------------------------- reference

def ref_rank(scores, token):
    return int((scores > scores[token]).sum()) + 1


# ---------------------------------------------------------------- helpers

def state(prompt=(1, 2, 3), output=(), **kw):
    return RequestSamplingState(SamplingParams(**kw), list(prompt), list(output))


def run(states, logits, mode="raw_logprobs", bitmask=None, vocab=None, candidates=1024,
        cpu_kernel=True):
    vocab = vocab or logits.shape[1]
    batch = build_sampling_batch(states, vocab)
    sampler = Sampler(vocab, mode, top_p_candidates=candidates, cpu_kernel=cpu_kernel)
    res = sampler(mx.array(logits, dtype=mx.float32), batch, bitmask)
    lp = None if res.logprobs is None else tuple(np.array(a) for a in res.logprobs)
    return np.array(res.sampled), lp


def full_rows(lp, vocab):
    """Undo the top-V sort of logprobs=-1 output: [R, V] scores by token id."""
    ids, vals, _ = lp
    out = np.full((ids.shape[0], vocab), np.nan)
    for r in range(ids.shape[0]):
        out[r, ids[r, 1:]] = vals[r, 1:]
    return out


def assert_same_scores(got, want):
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=2e-5, atol=2e-5)


# A mixed batch where every row differs in every feature.
MIXED = [
    dict(temperature=0.0, repetition_penalty=1.4),
    dict(temperature=0.7, top_k=30, presence_penalty=0.8, frequency_penalty=0.3),
    dict(temperature=1.3, top_p=0.6, logit_bias={3: 4.0, 9: -2.0}),
    dict(temperature=0.9, min_p=0.2, top_k=12, top_p=0.9, seed=11),
    dict(temperature=1.0, allowed_token_ids=[0, 2, 4, 6, 8, 10, 33], seed=5),
    dict(temperature=0.5, _bad_words_token_ids=[[7], [4, 5], [1, 9, 2]],
         min_tokens=4, stop_token_ids=[6, 8]),
]
OUTPUTS = [[3, 3, 5], [4, 4, 4, 2], [9], [], [1, 4], [1, 9]]


def mixed_states(extra):
    return [state(output=o, **p, **extra) for p, o in zip(MIXED, OUTPUTS)]


@pytest.fixture
def logits():
    return np.random.default_rng(0).normal(0, 2, (len(MIXED), 40)).astype(np.float32)


# ---------------------------------------------------------------- processing

@pytest.mark.parametrize("mode, candidates", [
    ("processed_logits", None), ("processed_logits", 3), ("processed_logprobs", 1024)])
def test_processed_scores_match_reference(logits, mode, candidates):
    states = mixed_states(dict(logprobs=-1))
    sampled, lp = run(states, logits, mode, candidates=candidates)
    got = full_rows(lp, logits.shape[1])
    for r, st in enumerate(states):
        want = ref_filter(ref_process(logits[r], st.params, st.prompt_token_ids,
                                      st.output_token_ids), st.params)
        if mode == "processed_logprobs":
            want = ref_log_softmax(want)
        assert_same_scores(got[r], want)
        assert np.isfinite(want[sampled[r]])
        assert lp[2][r] == ref_rank(want, sampled[r])


def test_raw_modes_ignore_processing(logits):
    states = mixed_states(dict(logprobs=-1))
    _, lp = run(states, logits, "raw_logprobs")
    for r in range(len(states)):
        assert_same_scores(full_rows(lp, 40)[r], ref_log_softmax(logits[r].astype(np.float64)))
    _, lp = run(states, logits, "raw_logits")
    np.testing.assert_array_equal(full_rows(lp, 40), logits)


@pytest.mark.parametrize("cpu_kernel", [True, False], ids=["kernel", "gumbel"])
def test_greedy_rows_take_argmax_of_processed_logits(logits, cpu_kernel):
    states = mixed_states({})
    sampled, _ = run(states, logits, cpu_kernel=cpu_kernel)
    st = states[0]
    want = ref_process(logits[0], st.params, st.prompt_token_ids, st.output_token_ids)
    assert sampled[0] == np.argmax(want)
    plain = [state(temperature=0.0) for _ in range(6)]
    sampled, lp = run(plain, logits, cpu_kernel=cpu_kernel)
    assert lp is None
    np.testing.assert_array_equal(sampled, logits.argmax(axis=1))


def test_logits_wider_than_vocab_never_sample_padding():
    logits = np.zeros((3, 20), np.float32)
    logits[:, 16:] = 50.0  # padded lm_head columns
    logits[:, 5] = 1.0
    states = [state(temperature=0.0), state(temperature=0.0, logprobs=2), state(seed=1)]
    sampled, lp = run(states, logits, vocab=16)
    assert sampled[0] == 5 and sampled[1] == 5 and sampled[2] < 16
    assert lp[0].max() < 16


def test_grammar_bitmask():
    vocab = 70  # three words, the last one partial
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, vocab)).astype(np.float32)
    bits = rng.integers(0, 2, size=(3, 96)).astype(np.uint64)
    bits[0] = 1  # a row without a grammar
    words = (bits.reshape(3, 3, 32) << np.arange(32, dtype=np.uint64)).sum(-1)
    bitmask = words.astype(np.uint32).view(np.int32)
    states = [state(temperature=0.0, logprobs=-1), state(logprobs=-1, seed=2),
              state(temperature=0.0, logprobs=-1, min_tokens=3, stop_token_ids=[1])]
    sampled, lp = run(states, logits, "processed_logits", bitmask)
    got = full_rows(lp, vocab)
    for r, st in enumerate(states):
        want = ref_filter(ref_process(logits[r], st.params, [1, 2, 3], [], bitmask[r]), st.params)
        assert_same_scores(got[r], want)
        assert bits[r, sampled[r]] == 1


@pytest.mark.parametrize("rows", [1, 3, 6])
@pytest.mark.parametrize("greedy", [True, False])
def test_a_grammar_alone_is_masked_in_the_kernel_as_the_mlx_path_masks(rows, greedy):
    # With no other processor the kernel reads the bitmask itself: the same greedy
    # tokens as the MLX masking path, and draws only among the admitted tokens.
    vocab = 1000
    rng = np.random.default_rng(rows)
    logits = rng.normal(0, 3, (rows, vocab)).astype(np.float32)
    bits = (rng.random((rows, 1024)) < 0.05).astype(np.uint64)
    bits[:, 7] = 1
    words = (bits.reshape(rows, 32, 32) << np.arange(32, dtype=np.uint64)).sum(-1)
    bitmask = words.astype(np.uint32).view(np.int32)
    params = dict(temperature=0.0) if greedy else dict(temperature=0.8, top_k=20)
    states = [state(seed=i, **params) for i in range(rows)]
    batch = build_sampling_batch(states, vocab)
    assert batch.unprocessed
    fused, _ = run(states, logits, bitmask=bitmask)
    for r in range(rows):
        assert bits[r, fused[r]] == 1
    if greedy:
        assert batch.all_greedy_plain
        masked = np.where(bits[:, :vocab] == 1, logits, -np.inf)
        np.testing.assert_array_equal(fused, np.argmax(masked, axis=-1))
        mlx_path, _ = run(states, logits, bitmask=bitmask, cpu_kernel=False)
        np.testing.assert_array_equal(fused, mlx_path)


def test_grammar_bitmask_must_cover_vocab():
    batch = build_sampling_batch([state()], 70)
    with pytest.raises(ValueError, match="grammar_bitmask"):
        Sampler(70)(mx.zeros((1, 70)), batch, np.full((1, 2), -1, np.int32))
    with pytest.raises(TypeError, match="grammar_bitmask"):
        Sampler(70)(mx.zeros((1, 70)), batch, np.full((1, 3), 1, np.int64))


def test_min_tokens_bans_stop_tokens_until_reached():
    logits = np.zeros((3, 10), np.float32)
    logits[:, 7] = 5.0  # EOS is the argmax
    params = dict(temperature=0.0, min_tokens=2, stop_token_ids=[7])
    below = state(output=[1], **params)
    reached = state(output=[1, 2], **params)
    # Only stop tokens left: banning them would leave nothing, so they stay.
    cornered = state(output=[], allowed_token_ids=[7], **params)
    sampled, _ = run([below, reached, cornered], logits)
    assert sampled[0] != 7 and sampled[1] == 7 and sampled[2] == 7


def test_bad_words_match_the_end_of_the_output():
    logits = np.zeros((3, 10), np.float32)
    logits[:, [2, 5, 9]] = [3.0, 2.0, 1.0]
    words = [[2], [4, 5]]
    states = [state(temperature=0.0, output=[1, 4], _bad_words_token_ids=words),
              state(temperature=0.0, output=[4, 1], _bad_words_token_ids=words),
              state(temperature=0.0, output=[4, 1])]
    sampled, _ = run(states, logits)
    assert sampled.tolist() == [9, 5, 2]


def test_top_k_keeps_ties_and_top_p_keeps_the_argmax():
    logits = np.array([[1.0, 3.0, 3.0, 2.0, 0.0], [0.0, 9.0, 1.0, 2.0, 0.5]], np.float32)
    states = [state(top_k=1, logprobs=-1, seed=0), state(top_p=1e-6, logprobs=-1, seed=0)]
    _, lp = run(states, logits, "processed_logits")
    got = full_rows(lp, 5)
    assert np.isfinite(got[0]).tolist() == [False, True, True, False, False]
    assert np.isfinite(got[1]).tolist() == [False, True, False, False, False]


def test_top_p_candidates_decide_or_fall_back_to_a_full_sort(monkeypatch):
    sizes = []
    real = logits_processing._thresholds
    monkeypatch.setattr(logits_processing, "_thresholds",
                        lambda x, size, *a: sizes.append(size) or real(x, size, *a))
    rng = np.random.default_rng(4)
    peaked = rng.normal(0, 0.3, (2, 64)).astype(np.float32)
    peaked[:, :3] += 6.0  # three tokens hold nearly all the mass
    flat = rng.normal(0, 0.3, (1, 64)).astype(np.float32)
    params = [dict(top_p=0.9, seed=1), dict(top_p=0.7, top_k=20, seed=2), dict(top_p=0.8, seed=3)]
    # The candidate count grows to the largest top_k (20).
    for rows, want_sizes in [(peaked, [20]), (np.concatenate([peaked, flat]), [20, 64])]:
        sizes.clear()
        states = [state(logprobs=-1, **p) for p in params[:len(rows)]]
        _, lp = run(states, rows, "processed_logits", candidates=8)
        assert sizes == want_sizes
        got = full_rows(lp, 64)
        for r, st in enumerate(states):
            assert_same_scores(got[r], ref_filter(rows[r].astype(np.float64), st.params))


# ---------------------------------------------------------------- random sampling

def chi2_critical(df, z=3.72):
    """Wilson-Hilferty quantile of chi-square(df) at upper tail ~1e-4."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def chi2(counts, probs):
    keep = probs > 0
    assert counts[~keep].sum() == 0, "sampled a filtered-out token"
    expected = probs[keep] * counts.sum()
    return ((counts[keep] - expected) ** 2 / expected).sum(), keep.sum() - 1


@pytest.mark.parametrize("params", [
    dict(temperature=0.7),
    dict(temperature=1.5, top_k=4),
    dict(temperature=1.0, top_p=0.8, min_p=0.05),
    dict(temperature=1.2, repetition_penalty=1.5, frequency_penalty=0.4, presence_penalty=-0.6,
         logit_bias={0: 1.5}),
])
@pytest.mark.parametrize("seeded", [False, True])
@pytest.mark.parametrize("cpu_kernel", [True, False], ids=["kernel", "gumbel"])
def test_draws_follow_the_filtered_distribution(params, seeded, cpu_kernel):
    draws, vocab = 6000, 8
    raw = np.array([2.0, 1.5, 1.0, 0.6, 0.3, 0.0, -0.5, -1.0], np.float32)
    mx.random.seed(1234)
    shared = SamplingParams(**params)
    states = [RequestSamplingState(shared, [1], [1, 2, 2], generator_seed=i if seeded else None)
              for i in range(draws)]
    sampled, _ = run(states, np.tile(raw, (draws, 1)), cpu_kernel=cpu_kernel)
    want = np.exp(ref_log_softmax(ref_filter(ref_process(raw, shared, [1], [1, 2, 2]), shared)))
    counts = np.bincount(sampled, minlength=vocab)
    stat, df = chi2(counts, want)
    assert stat < chi2_critical(df), (counts, want * draws)
    # The test has power: the unfiltered softmax is rejected.
    plain = np.exp(ref_log_softmax(raw.astype(np.float64)))
    assert ((counts - plain * draws) ** 2 / (plain * draws)).sum() > chi2_critical(vocab - 1)


@pytest.mark.parametrize("cpu_kernel", [True, False], ids=["kernel", "gumbel"])
def test_seeded_rows_ignore_batch_composition(cpu_kernel):
    vocab = 1000
    flat = np.zeros(vocab, np.float32)  # uniform: the draw is all noise
    rng = np.random.default_rng(3)
    seeded = dict(seed=77, temperature=1.0, top_p=0.95)

    def draw(rows, at, steps):
        states = [state(output=[1] * rng.integers(0, 5), temperature=0.8, top_k=50)
                  for _ in range(rows)]
        states.insert(at, state(output=[4] * steps, **seeded))
        logits = rng.normal(size=(rows + 1, vocab)).astype(np.float32)
        logits[at] = flat
        return run(states, logits, cpu_kernel=cpu_kernel)[0][at]

    first = draw(rows=0, at=0, steps=3)
    assert draw(rows=5, at=3, steps=3) == first
    assert draw(rows=2, at=2, steps=3) == first
    steps = {draw(rows=1, at=0, steps=s) for s in range(4)}
    assert len(steps) == 4  # a new step gives a new draw
    other_seed = state(output=[4] * 3, **{**seeded, "seed": 78})
    assert run([other_seed], flat[None], cpu_kernel=cpu_kernel)[0][0] != first


@pytest.mark.parametrize("cpu_kernel", [True, False], ids=["kernel", "gumbel"])
def test_unseeded_rows_follow_the_global_rng(cpu_kernel):
    states = [state(temperature=1.0) for _ in range(16)]
    logits = np.zeros((16, 500), np.float32)
    mx.random.seed(9)
    a, _ = run(states, logits, cpu_kernel=cpu_kernel)
    mx.random.seed(9)
    b, _ = run(states, logits, cpu_kernel=cpu_kernel)
    c, _ = run(states, logits, cpu_kernel=cpu_kernel)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(b, c)


# ---------------------------------------------------------------- logprobs

@pytest.mark.parametrize("cpu_kernel", [True, False], ids=["kernel", "mlx"])
def test_logprob_columns_mixed_k(logits, cpu_kernel):
    states = [state(temperature=0.0, logprobs=1), state(logprobs=3, seed=1),
              state(temperature=0.0), state(logprobs=0, seed=2)]
    sampled, (ids, vals, ranks) = run(states, logits[:4], cpu_kernel=cpu_kernel)
    assert ids.shape == vals.shape == (4, 4) and ranks.shape == (4,)
    for r in range(4):
        ref = ref_log_softmax(logits[r].astype(np.float64))
        order = np.argsort(-ref)
        assert ids[r, 0] == sampled[r]
        np.testing.assert_array_equal(ids[r, 1:], order[:3])
        np.testing.assert_allclose(vals[r], ref[ids[r]], rtol=1e-5, atol=1e-5)
        assert ranks[r] == ref_rank(ref, sampled[r])
    assert ranks[0] == 1


@pytest.mark.parametrize("cpu_kernel", [True, False], ids=["kernel", "mlx"])
def test_front_end_reads_each_request_k(logits, cpu_kernel):
    """vLLM's output processor turns each row into {token: Logprob} with k + 1 entries."""
    from vllm.logprobs import append_logprobs_for_next_position, create_sample_logprobs

    ks = [1, 3, 0, -1]
    states = [state(logprobs=k, seed=i) for i, k in enumerate(ks)]
    sampled, (ids, vals, ranks) = run(states, logits[:4], cpu_kernel=cpu_kernel)
    for r, k in enumerate(ks):
        out = create_sample_logprobs(False)
        append_logprobs_for_next_position(out, ids[r].tolist(), vals[r].tolist(),
                                          [None] * ids.shape[1], int(ranks[r]), k)
        ref = ref_log_softmax(logits[r].astype(np.float64))
        top = np.argsort(-ref)[:40 if k == -1 else k]
        assert set(out[0]) == {int(sampled[r]), *top.tolist()}
        assert out[0][int(sampled[r])].logprob == pytest.approx(ref[sampled[r]], abs=1e-5)
        for rank, tok in enumerate(top, 1):
            assert out[0][int(tok)].rank == rank


def test_logprob_token_ids_rows(logits):
    states = [state(logprob_token_ids=[5, 1, 30], seed=1), state(logprobs=2, seed=2),
              state(temperature=0.0, logprob_token_ids=[7])]
    sampled, (ids, vals, ranks) = run(states, logits[:3])
    assert ids.shape == (3, 4)
    assert ids[0, 1:].tolist() == [5, 1, 30] and ids[2, 1].tolist() == 7
    assert np.isneginf(vals[2, 2:]).all()
    for r in range(3):
        ref = ref_log_softmax(logits[r].astype(np.float64))
        width = 4 if r == 0 else (3 if r == 1 else 2)
        np.testing.assert_allclose(vals[r, :width], ref[ids[r, :width]], rtol=1e-5, atol=1e-5)
        assert ranks[r] == ref_rank(ref, sampled[r])
    np.testing.assert_array_equal(ids[1, 1:3], np.argsort(-logits[1])[:2])


@pytest.mark.parametrize("cpu_kernel", [True, False], ids=["kernel", "mlx"])
@pytest.mark.parametrize("mode", ["raw_logprobs", "raw_logits", "processed_logprobs"])
def test_prompt_logprobs(mode, cpu_kernel):
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 3, (7, 24)).astype(np.float32)
    targets = rng.integers(0, 20, 7)
    ids, vals, ranks = (np.array(a) for a in compute_prompt_logprobs(
        mx.array(logits), mx.array(targets), 4, mode, vocab_size=20, cpu_kernel=cpu_kernel))
    assert ids.shape == (7, 5)
    for n in range(7):
        ref = logits[n, :20].astype(np.float64)
        if mode != "raw_logits":
            ref = ref_log_softmax(ref)
        assert ids[n, 0] == targets[n] and ranks[n] == ref_rank(ref, targets[n])
        np.testing.assert_array_equal(ids[n, 1:], np.argsort(-ref)[:4])
        np.testing.assert_allclose(vals[n], ref[ids[n]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cpu_kernel", [True, False], ids=["kernel", "mlx"])
def test_prompt_logprobs_whole_vocab_and_padding(cpu_kernel):
    logits = mx.array(np.random.default_rng(6).normal(size=(2, 5)).astype(np.float32))
    ids, vals, _ = compute_prompt_logprobs(logits, mx.array([1, 2]), -1, cpu_kernel=cpu_kernel)
    assert ids.shape == (2, 6) and sorted(np.array(ids)[0, 1:].tolist()) == list(range(5))
    ids, vals, _ = compute_prompt_logprobs(logits, mx.array([1, 2]), 7, cpu_kernel=cpu_kernel)
    assert ids.shape == (2, 8) and np.isneginf(np.array(vals)[:, 6:]).all()
    with pytest.raises(ValueError, match="num_logprobs"):
        compute_prompt_logprobs(logits, mx.array([1, 2]), -2)
    with pytest.raises(ValueError, match="target_ids"):
        compute_prompt_logprobs(logits, mx.array([1, 2, 3]), 1)
    with pytest.raises(ValueError, match="logprobs_mode"):
        compute_prompt_logprobs(logits, mx.array([1, 2]), 1, "logits")
