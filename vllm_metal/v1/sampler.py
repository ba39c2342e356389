"""Logits -> sampled tokens and logprobs, as lazy MLX ops.

Nothing is evaluated here, except one bool [R] when top-p must decide whether
its candidate tokens suffice (see Sampler's top_p_candidates; MLX-ops path
only) and, once per Sampler, the seed of its host-side key generator.

Follows vLLM 0.33's v1 Sampler: raw logprobs are taken before any processing;
processors act on raw logits; greedy rows take the argmax of processed logits;
random rows apply temperature, min_p, top-k/top-p and draw by Gumbel-max.

On the CPU backend (the runner passes its backend's ``sampling_kernels`` as
``cpu_kernel``), temperature, min_p, top-k/top-p and the draw are one kernel,
vllm_metal.ops.sampling.sample_tokens: an inverse-CDF draw
needs one uniform per row where Gumbel-max needs V uniforms and 2V logs, and
the filters need no sort; MLX's CPU backend computes those in scalar nodes
(1.8 ms per 49k-token row at temperature 1, 8 ms with top-p).
Processed-logprobs modes keep the MLX filters (their scores need the filtered
logits) and hand the kernel only the draw.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx
import numpy as np

from vllm_metal.ops.sampling import sample_tokens, top_logprobs
from vllm_metal.v1.logits_processing import (
    TOP_P_CANDIDATES,
    apply_processors,
    apply_sampling_filters,
    grammar_bitmask_words,
)
from vllm_metal.v1.sampling_batch import SamplingBatch

LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")

# Uniform draws stay strictly inside (0, 1) so the Gumbel noise is always finite
# (a +inf draw on a -inf logit would give NaN).
_U_LOW = float(np.finfo(np.float32).tiny)
_U_HIGH = float(np.nextafter(np.float32(1.0), np.float32(0.0)))


class SamplerLogprobs(NamedTuple):
    """Column 0 is the sampled (or target) token, columns 1.. the top-K (or asked ids)."""

    token_ids: mx.array  # int32 [R, K + 1]
    logprobs: mx.array   # float32 [R, K + 1]
    ranks: mx.array      # int32 [R]: 1 + number of tokens scored above column 0 (ties count)


class SamplerResult(NamedTuple):
    sampled: mx.array                   # int32 [R]
    logprobs: SamplerLogprobs | None


def _check_mode(logprobs_mode: str) -> None:
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")


def _check_logits(logits: mx.array, num_rows: int | None, vocab_size: int,
                  name: str = "logits") -> None:
    if not isinstance(logits, mx.array):
        raise TypeError(f"{name} must be an mx.array, got {type(logits).__name__}")
    if logits.ndim != 2:
        raise ValueError(f"{name} must be 2-D [rows, vocab], got shape {logits.shape}")
    if num_rows is not None and logits.shape[0] != num_rows:
        raise ValueError(f"{name} has {logits.shape[0]} rows but the batch has {num_rows}")
    if logits.shape[1] < vocab_size:
        raise ValueError(f"{name} has {logits.shape[1]} columns, fewer than "
                         f"vocab_size={vocab_size}")
    if not mx.issubdtype(logits.dtype, mx.floating):
        raise TypeError(f"{name} must be floating point, got {logits.dtype}")


def log_softmax(x: mx.array) -> mx.array:
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def gumbel_noise(keys: mx.array, vocab_size: int) -> mx.array:
    """float32 [R, V] Gumbel(0, 1) noise; row r depends only on keys[r] (uint32 [R, 2])."""
    def row(key: mx.array) -> mx.array:
        u = mx.random.uniform(low=_U_LOW, high=_U_HIGH, shape=(vocab_size,), key=key)
        return -mx.log(-mx.log(u))
    return mx.vmap(row)(keys)


def row_keys(batch: SamplingBatch, rng: np.random.Generator) -> mx.array:
    """uint32 [R, 2]: seeded rows' own keys, fresh keys from `rng` otherwise.

    The keys are made on the host: MLX's global RNG would put key-splitting
    nodes into every step's graph, and with them mx.async_eval of a decode step
    waited ~1 ms for the step in flight (the decode pipeline lost its overlap).
    """
    fresh = rng.integers(0, 1 << 32, size=(batch.num_rows, 2), dtype=np.uint32)
    if batch.seeded_rows.any():
        fresh = np.where(batch.seeded_rows[:, None], batch.seeded_keys, fresh)
    return mx.array(fresh)


def gather_logprobs(scores: mx.array, token_ids: mx.array, num_logprobs: int,
                    explicit_ids: np.ndarray | None = None,
                    explicit_rows: np.ndarray | None = None) -> SamplerLogprobs:
    """scores [R, V] -> column 0 = token_ids [R], then each row's top `num_logprobs`.

    Rows flagged in explicit_rows (bool [R]) get explicit_ids (int32 [R, K], -1 pads,
    scored -inf) instead of their top-K. Top-K columns beyond V are padded (id 0, -inf).
    """
    num_rows, vocab = scores.shape
    token_ids = token_ids.astype(mx.int32)
    chosen = mx.take_along_axis(scores, token_ids[:, None], axis=-1)
    ranks = (scores >= chosen).astype(mx.int32).sum(axis=-1)
    ids, vals = [token_ids[:, None]], [chosen]
    k = num_logprobs
    if k > 0:
        kk = min(k, vocab)
        top_ids = mx.argpartition(-scores, kth=kk - 1, axis=-1)[:, :kk]
        top_vals = mx.take_along_axis(scores, top_ids, axis=-1)
        order = mx.argsort(-top_vals, axis=-1)
        top_ids = mx.take_along_axis(top_ids, order, axis=-1).astype(mx.int32)
        top_vals = mx.take_along_axis(top_vals, order, axis=-1)
        if kk < k:
            top_ids = mx.pad(top_ids, [(0, 0), (0, k - kk)])
            top_vals = mx.pad(top_vals, [(0, 0), (0, k - kk)], constant_values=-np.inf)
        if explicit_ids is not None:
            pad = mx.array(explicit_ids < 0)
            ex_ids = mx.array(np.maximum(explicit_ids, 0).astype(np.int32))
            ex_vals = mx.where(pad, -np.inf, mx.take_along_axis(scores, ex_ids, axis=-1))
            use = mx.array(explicit_rows)[:, None]
            top_ids = mx.where(use, ex_ids, top_ids)
            top_vals = mx.where(use, ex_vals, top_vals)
        ids.append(top_ids)
        vals.append(top_vals)
    return SamplerLogprobs(mx.concatenate(ids, axis=1),
                           mx.concatenate(vals, axis=1).astype(mx.float32), ranks)


def _filter_arrays(batch: SamplingBatch) -> dict[str, mx.array]:
    """The batch's min_p / top_k / top_p as sample_tokens arguments (absent: not passed)."""
    fields = {"min_p": batch.min_p, "top_k": batch.top_k, "top_p": batch.top_p}
    return {name: mx.array(v) for name, v in fields.items() if v is not None}


class Sampler:
    """Samples one token per row from logits [R, V_model] (V_model >= vocab_size).

    vocab_size: leading logit columns that are real tokens (vLLM's
    model_config.get_vocab_size()); columns past it are never sampled.
    top_p_candidates: how many top logits top-p inspects before falling back to a
    full sort (one host sync); None always sorts the whole vocab and never syncs.
    cpu_kernel: pick tokens (and logprobs) with the CPU kernels of
    vllm_metal.ops.sampling (True) or with MLX ops and Gumbel-max (False); the
    runner passes its backend's ``sampling_kernels``.
    """

    def __init__(self, vocab_size: int, logprobs_mode: str = "raw_logprobs",
                 top_p_candidates: int | None = TOP_P_CANDIDATES,
                 cpu_kernel: bool = True) -> None:
        if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        _check_mode(logprobs_mode)
        if top_p_candidates is not None and (
                not isinstance(top_p_candidates, int) or top_p_candidates < 1):
            raise ValueError(f"top_p_candidates must be a positive int or None, "
                             f"got {top_p_candidates!r}")
        if not isinstance(cpu_kernel, bool):
            raise TypeError(f"cpu_kernel must be a bool, got {cpu_kernel!r}")
        self.vocab_size = vocab_size
        self.logprobs_mode = logprobs_mode
        self.top_p_candidates = top_p_candidates
        self.cpu_kernel = cpu_kernel
        self._rng: np.random.Generator | None = None

    @property
    def rng(self) -> np.random.Generator:
        """The host generator of unseeded rows' keys (and speculative acceptances)."""
        if self._rng is None:
            # Seeded once from MLX's global RNG (one sync), which the worker
            # seeds from vLLM's --seed: unseeded draws stay reproducible.
            words = np.array(mx.random.randint(0, 1 << 30, shape=(2,)), dtype=np.int64)
            self._rng = np.random.default_rng(int(words[0] << 30 | words[1]))
        return self._rng

    def keys(self, batch: SamplingBatch) -> mx.array:
        """uint32 [R, 2]: each row's draw key (row_keys)."""
        return row_keys(batch, self.rng)

    def argmax(self, logits: mx.array, use_kernel: bool,
                allowed: mx.array | None = None) -> mx.array:
        # Measured (benchmarks/bench_sampler.py): MLX's argmax is as fast for a
        # row or two; the kernel wins from a few rows on (2.3x at 16).
        if allowed is None and (not use_kernel or logits.shape[0] < 4):
            return mx.argmax(logits, axis=-1)
        rows = logits.shape[0]
        return sample_tokens(logits, mx.zeros((rows,)), mx.zeros((rows, 2), dtype=mx.uint32),
                             allowed=allowed)

    def _check_bitmask(self, bitmask: np.ndarray, num_rows: int) -> None:
        if not isinstance(bitmask, np.ndarray) or bitmask.dtype != np.int32:
            raise TypeError("grammar_bitmask must be an int32 numpy array, got "
                            f"{type(bitmask).__name__} {getattr(bitmask, 'dtype', '')}")
        words = -(-self.vocab_size // 32)
        if bitmask.ndim != 2 or bitmask.shape[0] != num_rows or bitmask.shape[1] < words:
            raise ValueError(f"grammar_bitmask must have shape [{num_rows}, >= {words}], "
                             f"got {bitmask.shape}")

    def __call__(self, logits: mx.array, batch: SamplingBatch,
                 grammar_bitmask: np.ndarray | None = None) -> SamplerResult:
        """logits [R, V_model] -> SamplerResult (sampled int32 [R], optional logprobs).

        grammar_bitmask: int32 [R, ceil(V/32)], rows without a grammar all ones.
        """
        if not isinstance(batch, SamplingBatch):
            raise TypeError(f"batch must be a SamplingBatch, got {type(batch).__name__}")
        if batch.vocab_size != self.vocab_size:
            raise ValueError(f"batch was built for vocab_size={batch.vocab_size}, "
                             f"sampler has {self.vocab_size}")
        _check_logits(logits, batch.num_rows, self.vocab_size)
        if grammar_bitmask is not None:
            self._check_bitmask(grammar_bitmask, batch.num_rows)
        if logits.shape[1] != self.vocab_size:
            logits = logits[:, :self.vocab_size]
        if batch.num_rows == 0:
            return SamplerResult(mx.zeros((0,), dtype=mx.int32), None)
        use_kernel = self.cpu_kernel
        want_logprobs = batch.num_logprobs is not None
        processed_logprobs = want_logprobs and self.logprobs_mode.startswith("processed")
        allowed = None
        if (grammar_bitmask is not None and use_kernel and batch.unprocessed
                and not processed_logprobs):
            # The grammar is the only processor: the kernel masks while it reads the
            # row (measured: the mask as MLX ops costs ~5x the whole argmax).
            allowed = grammar_bitmask_words(grammar_bitmask)
            grammar_bitmask = None
        if batch.all_greedy_plain and grammar_bitmask is None:
            return SamplerResult(self.argmax(logits, use_kernel, allowed).astype(mx.int32), None)

        logits = logits.astype(mx.float32)
        raw = logits   # raw_* modes score the logits before any processing

        logits = apply_processors(logits, batch, grammar_bitmask)
        if batch.all_greedy:
            sampled = self.argmax(logits, use_kernel, allowed)
        elif use_kernel and not processed_logprobs:
            # The kernel applies the grammar, temperature, min_p, top-k and top-p
            # itself (greedy rows: T = 0, argmax).
            temperature = np.where(batch.greedy, 0.0, batch.temperature).astype(np.float32)
            sampled = sample_tokens(logits, mx.array(temperature), self.keys(batch),
                                    allowed=allowed, **_filter_arrays(batch))
        else:
            logits = apply_sampling_filters(logits, batch, self.top_p_candidates)
            if use_kernel:
                temperature = np.where(batch.greedy, 0.0, 1.0).astype(np.float32)
                sampled = sample_tokens(logits, mx.array(temperature), self.keys(batch))
            else:
                noise = gumbel_noise(self.keys(batch), self.vocab_size)
                noise = mx.where(mx.array(batch.greedy)[:, None], 0.0, noise)
                # -inf stays -inf under finite noise, so masked tokens are never drawn.
                sampled = mx.argmax(logits + noise, axis=-1)
        sampled = sampled.astype(mx.int32)
        if not want_logprobs:
            return SamplerResult(sampled, None)

        source = logits if self.logprobs_mode.startswith("processed") else raw
        return SamplerResult(sampled, self.logprobs(source, sampled, batch))

    def logprobs(self, source: mx.array, tokens: mx.array, batch: SamplingBatch
                 ) -> SamplerLogprobs:
        """The batch's logprobs of ``tokens`` (int32 [R]) and its top-K (or asked ids),
        scored from ``source`` [R, V] float32: the raw logits, or the processed ones
        in the processed_* modes."""
        normalize = self.logprobs_mode.endswith("logprobs")
        if self.cpu_kernel and batch.logprob_token_ids is None:
            return SamplerLogprobs(*top_logprobs(source, tokens, batch.num_logprobs, normalize))
        scores = log_softmax(source) if normalize else source
        return gather_logprobs(scores, tokens, batch.num_logprobs,
                               batch.logprob_token_ids, batch.explicit_logprob_rows)


def compute_prompt_logprobs(logits: mx.array, target_ids: mx.array, num_logprobs: int,
                            logprobs_mode: str = "raw_logprobs",
                            vocab_size: int | None = None,
                            cpu_kernel: bool = True) -> SamplerLogprobs:
    """Prompt logprobs: logits [N, V_model] at N prompt positions, target_ids int [N]
    the actual next prompt tokens -> (ids [N, K+1], logprobs [N, K+1], ranks [N]).

    num_logprobs: K, or -1 for the whole vocab. Prompt tokens skip the sampling
    processors, so processed_* modes equal raw_* (as in vLLM). cpu_kernel: as
    Sampler's (True: the top_logprobs kernel).
    """
    _check_mode(logprobs_mode)
    if vocab_size is None:
        vocab_size = logits.shape[-1] if isinstance(logits, mx.array) else 1
    _check_logits(logits, None, vocab_size)
    if not isinstance(target_ids, mx.array) or target_ids.shape != (logits.shape[0],):
        raise ValueError(f"target_ids must be an mx.array of shape [{logits.shape[0]}], "
                         f"got {getattr(target_ids, 'shape', type(target_ids).__name__)}")
    if not mx.issubdtype(target_ids.dtype, mx.integer):
        raise TypeError(f"target_ids must be integer, got {target_ids.dtype}")
    if isinstance(num_logprobs, bool) or not isinstance(num_logprobs, int) or num_logprobs < -1:
        raise ValueError(f"num_logprobs must be an int >= -1, got {num_logprobs!r}")
    # Not clamped to V: callers preallocate K + 1 columns; extra ones are padded.
    k = vocab_size if num_logprobs == -1 else num_logprobs
    scores = logits[:, :vocab_size].astype(mx.float32)
    normalize = logprobs_mode.endswith("logprobs")
    if cpu_kernel:
        return SamplerLogprobs(*top_logprobs(scores, target_ids, k, normalize))
    return gather_logprobs(log_softmax(scores) if normalize else scores, target_ids, k)
