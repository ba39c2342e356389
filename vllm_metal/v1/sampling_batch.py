"""Host side of sampling: per-request state -> one vectorized SamplingBatch per step.

Everything here is numpy built from small per-request lists; the vocab-wide work
happens in MLX (logits_processing.py, sampler.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams

# vLLM's _SAMPLING_EPS: a temperature below this samples greedily.
SAMPLING_EPS = 1e-5

_MASK64 = (1 << 64) - 1


@dataclass
class RequestSamplingState:
    """One request's sampling inputs, owned by the runner's persistent batch.

    The runner appends every sampled token to `output_token_ids`.
    `generator_seed` defaults to `params.seed`.
    """

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    generator_seed: int | None = None
    _prompt_array: np.ndarray | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.generator_seed is None:
            self.generator_seed = self.params.seed
        seed = self.generator_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"generator_seed must be an int or None, got {seed!r}")

    def extended(self, drafts: list[int]) -> RequestSamplingState:
        """This request as it would sample after ``drafts`` (a speculative row): the
        outputs gain the drafts, so penalties, bad words, min_tokens and the seeded
        key see the history that row follows."""
        row = RequestSamplingState(self.params, self.prompt_token_ids,
                                   self.output_token_ids + drafts, self.generator_seed)
        row._prompt_array = self._prompt_array
        return row

    @property
    def prompt_array(self) -> np.ndarray:
        """int32 [prompt_len], built once: the prompt never changes."""
        if self._prompt_array is None:
            self._prompt_array = np.asarray(self.prompt_token_ids, dtype=np.int32)
        return self._prompt_array


TokenPairs = tuple[np.ndarray, np.ndarray]  # (rows int32 [P], token_ids int32 [P])


@dataclass
class SamplingBatch:
    """Sampling inputs of the R rows that sample this step, in logits-row order.

    Optional fields are None when no row uses the feature, so the sampler adds
    no ops for it. Disabled rows hold neutral values (top_k = vocab_size,
    top_p = 1, min_p = 0, penalties 1/0/0).
    """

    num_rows: int
    vocab_size: int
    greedy: np.ndarray                      # bool [R]
    temperature: np.ndarray                 # float32 [R], 1.0 on greedy rows
    all_greedy: bool
    all_greedy_plain: bool                  # argmax of raw logits is the whole job
    seeded_rows: np.ndarray                 # bool [R]
    seeded_keys: np.ndarray                 # uint32 [R, 2], zeros on unseeded rows
    unprocessed: bool = False               # no logits processor (penalties, bias, masks)
    top_k: np.ndarray | None = None         # int32 [R]
    top_p: np.ndarray | None = None         # float32 [R]
    min_p: np.ndarray | None = None         # float32 [R]
    repetition_penalty: np.ndarray | None = None  # float32 [R]; set => all three set
    frequency_penalty: np.ndarray | None = None   # float32 [R]
    presence_penalty: np.ndarray | None = None    # float32 [R]
    prompt_tokens: TokenPairs | None = None  # penalized rows' prompt tokens
    output_tokens: TokenPairs | None = None  # penalized rows' output tokens
    logit_bias: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # rows, ids, f32
    allowed_rows: np.ndarray | None = None   # bool [R]: row has allowed_token_ids
    allowed_tokens: TokenPairs | None = None
    banned_tokens: TokenPairs | None = None  # bad_words whose prefix just matched
    stop_bans: TokenPairs | None = None      # stop tokens of rows below min_tokens
    num_logprobs: int | None = None          # K: columns after the sampled token
    logprob_token_ids: np.ndarray | None = None  # int32 [R, K], -1 pads
    explicit_logprob_rows: np.ndarray | None = None  # bool [R]
    # Penalties, bad_words and min_tokens read output_token_ids: the runner must
    # have appended last step's tokens before building this batch.
    depends_on_output_ids: bool = False


def _check_ids(ids: np.ndarray, vocab_size: int, what: str) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = ids[(ids < 0) | (ids >= vocab_size)][:8].tolist()
        raise ValueError(f"{what} has token ids outside [0, {vocab_size}): {bad}")


def _pairs(rows: list[int], ids: list[np.ndarray], vocab_size: int, what: str
           ) -> TokenPairs | None:
    if not rows:
        return None
    row_arr = np.concatenate(
        [np.full(len(t), r, dtype=np.int32) for r, t in zip(rows, ids)])
    id_arr = np.concatenate([np.asarray(t, dtype=np.int32).reshape(-1) for t in ids])
    _check_ids(id_arr, vocab_size, what)
    return row_arr, id_arr


def splitmix64(z: np.ndarray) -> np.ndarray:
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def seeded_keys(seeds: list[int], steps: list[int]) -> np.ndarray:
    """uint32 [S, 2] threefry keys that depend only on (seed, step).

    step = tokens the request has generated so far, so a seeded request draws
    the same noise whatever batch it is in.
    """
    s = np.array([x & _MASK64 for x in seeds], dtype=np.uint64)
    t = np.array(steps, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = splitmix64(splitmix64(s) ^ splitmix64(t ^ np.uint64(0x5DEECE66D)))
    return np.stack([(z >> np.uint64(32)).astype(np.uint32),
                     (z & np.uint64(0xFFFFFFFF)).astype(np.uint32)], axis=1)


def _bad_word_bans(bad_words: list[list[int]], output: list[int]) -> list[int]:
    """Last tokens of the bad words whose prefix ends the output (vLLM: output only)."""
    banned = []
    for word in bad_words:
        prefix = len(word) - 1
        if prefix > len(output):
            continue
        if prefix == 0 or output[-prefix:] == word[:-1]:
            banned.append(word[-1])
    return banned


def build_sampling_batch(states: list[RequestSamplingState], vocab_size: int
                         ) -> SamplingBatch:
    """Vectorize the sampling inputs of `states` (one per logits row, in order)."""
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    if not isinstance(states, (list, tuple)):
        raise TypeError(f"states must be a list of RequestSamplingState, got {type(states)}")
    for i, st in enumerate(states):
        if not isinstance(st, RequestSamplingState):
            raise TypeError(f"states[{i}] must be a RequestSamplingState, got {type(st)}")

    n, v = len(states), vocab_size
    temp = np.array([st.params.temperature for st in states], dtype=np.float32).reshape(n)
    greedy = temp < SAMPLING_EPS
    temperature = np.where(greedy, np.float32(1.0), temp).astype(np.float32)

    # Greedy rows never filter, as vLLM resets these params for temperature 0.
    top_k = np.array([st.params.top_k for st in states], dtype=np.int64).reshape(n)
    top_k = np.where(greedy | (top_k <= 0) | (top_k >= v), v, top_k).astype(np.int32)
    top_p = np.array([st.params.top_p for st in states], dtype=np.float32).reshape(n)
    top_p = np.where(greedy, np.float32(1.0), top_p).astype(np.float32)
    min_p = np.array([st.params.min_p for st in states], dtype=np.float32).reshape(n)
    min_p = np.where(greedy, np.float32(0.0), min_p).astype(np.float32)

    seeded_rows = np.array([not g and st.generator_seed is not None
                            for st, g in zip(states, greedy)], dtype=bool).reshape(n)
    keys = np.zeros((n, 2), dtype=np.uint32)
    if seeded_rows.any():
        idx = np.flatnonzero(seeded_rows)
        keys[idx] = seeded_keys([states[i].generator_seed for i in idx],
                                [len(states[i].output_token_ids) for i in idx])

    rep = np.array([st.params.repetition_penalty for st in states], np.float32).reshape(n)
    freq = np.array([st.params.frequency_penalty for st in states], np.float32).reshape(n)
    pres = np.array([st.params.presence_penalty for st in states], np.float32).reshape(n)
    penalized = (rep != 1.0) | (freq != 0.0) | (pres != 0.0)

    bias_rows, bias_ids, bias_vals = [], [], []
    allowed_rows = np.zeros(n, dtype=bool)
    allowed_r, allowed_ids = [], []
    ban_r, ban_ids = [], []
    stop_r, stop_ids = [], []
    lp_k = np.full(n, -1, dtype=np.int64)  # -1: row wants no logprobs
    explicit: dict[int, list[int]] = {}
    uses_history = bool(penalized.any())
    for i, st in enumerate(states):
        p = st.params
        if p.logit_bias:
            bias_rows.append(i)
            bias_ids.append(np.fromiter((int(t) for t in p.logit_bias), np.int32))
            bias_vals.append(np.fromiter(p.logit_bias.values(), np.float32))
        if p.allowed_token_ids is not None:
            allowed_rows[i] = True
            allowed_r.append(i)
            allowed_ids.append(np.asarray(p.allowed_token_ids, dtype=np.int32))
        bad_words = p.bad_words_token_ids
        if bad_words:
            uses_history = True
            banned = _bad_word_bans(bad_words, st.output_token_ids)
            if banned:
                ban_r.append(i)
                ban_ids.append(np.asarray(banned, dtype=np.int32))
        if p.min_tokens:
            uses_history = True
            stops = p.all_stop_token_ids
            if len(st.output_token_ids) < p.min_tokens and stops:
                stop_r.append(i)
                stop_ids.append(np.fromiter(stops, np.int32))
        if p.logprob_token_ids is not None:
            explicit[i] = list(p.logprob_token_ids)
        elif p.logprobs is not None:
            lp_k[i] = v if p.logprobs == -1 else min(int(p.logprobs), v)

    batch = SamplingBatch(
        num_rows=n, vocab_size=v, greedy=greedy, temperature=temperature,
        all_greedy=bool(greedy.all()), all_greedy_plain=False,
        seeded_rows=seeded_rows, seeded_keys=keys,
        depends_on_output_ids=uses_history)
    if (top_k < v).any():
        batch.top_k = top_k
    if (top_p < 1.0).any():
        batch.top_p = top_p
    if (min_p > 0.0).any():
        batch.min_p = min_p
    if penalized.any():
        batch.repetition_penalty = np.where(penalized, rep, 1.0).astype(np.float32)
        batch.frequency_penalty = np.where(penalized, freq, 0.0).astype(np.float32)
        batch.presence_penalty = np.where(penalized, pres, 0.0).astype(np.float32)
        rows = np.flatnonzero(penalized).tolist()
        # The prompt matters only to the repetition penalty.
        rep_rows = [r for r in rows if rep[r] != 1.0]
        batch.prompt_tokens = _pairs(
            rep_rows, [states[r].prompt_array for r in rep_rows], v, "prompt_token_ids")
        batch.output_tokens = _pairs(
            rows, [states[r].output_token_ids for r in rows], v, "output_token_ids")
    if bias_rows:
        r, ids = _pairs(bias_rows, bias_ids, v, "logit_bias")
        batch.logit_bias = (r, ids, np.concatenate(bias_vals))
    if allowed_r:
        batch.allowed_rows = allowed_rows
        batch.allowed_tokens = _pairs(allowed_r, allowed_ids, v, "allowed_token_ids")
    batch.banned_tokens = _pairs(ban_r, ban_ids, v, "bad_words_token_ids")
    batch.stop_bans = _pairs(stop_r, stop_ids, v, "all_stop_token_ids (min_tokens)")

    if explicit or (lp_k >= 0).any():
        width = max([0, int(lp_k.max())] + [len(t) for t in explicit.values()])
        batch.num_logprobs = width
        if explicit:
            ids = np.full((n, width), -1, dtype=np.int32)
            for i, toks in explicit.items():
                ids[i, :len(toks)] = toks
            _check_ids(ids[ids >= 0], v, "logprob_token_ids")
            batch.logprob_token_ids = ids
            batch.explicit_logprob_rows = np.isin(np.arange(n), list(explicit))

    batch.unprocessed = not (
        penalized.any() or bias_rows or allowed_r or batch.banned_tokens is not None
        or batch.stop_bans is not None)
    batch.all_greedy_plain = (batch.all_greedy and batch.unprocessed
                              and batch.num_logprobs is None)
    return batch


class SamplingBatchCache:
    """The last SamplingBatch, handed out again while the same request states sample in
    the same order and nothing in it reads their outputs so far (seeded keys, penalties,
    bad words, min_tokens): a steady decode step then builds nothing. Holds the states
    themselves, so identity cannot be fooled by a reused id()."""

    def __init__(self) -> None:
        self._states: tuple[RequestSamplingState, ...] = ()
        self._batch: SamplingBatch | None = None

    def get(self, states: list[RequestSamplingState], vocab_size: int) -> SamplingBatch:
        cached = self._batch
        if (cached is not None and cached.vocab_size == vocab_size
                and len(states) == len(self._states)
                and all(a is b for a, b in zip(states, self._states))):
            return cached
        batch = build_sampling_batch(states, vocab_size)
        if batch.depends_on_output_ids or batch.seeded_rows.any():
            self._states, self._batch = (), None
        else:
            self._states, self._batch = tuple(states), batch
        return batch
