"""The acceptance rule of speculative decoding, over a step's verification rows.

A request with k drafts d_0..d_{k-1} owns k + 1 consecutive logits rows: row j scores
the token that follows its outputs and d_0..d_{j-1}; row k scores the bonus token.
Drafts here are proposals of probability one (a prompt lookup, a draft model's argmax),
and the standard rule (Leviathan et al., 2023; Chen et al., 2023) with a one-hot draft
distribution keeps the target's distribution exactly:

- greedy rows accept d_j when it is the target's argmax; the first refusal emits
  that argmax;
- sampled rows accept d_j with probability p_j(d_j); the first refusal emits a draw
  from p_j without d_j, renormalised; with every draft accepted, a draw from p_k.

p_j is the target's distribution after the processors (penalties, masks, grammar),
temperature and top-k/top-p, as the sampler would draw from at that row. A draft of
-1 (vLLM pads drafts with it) is refused wherever it stands.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx
import numpy as np

from vllm_metal.ops.sampling import sample_tokens
from vllm_metal.v1.logits_processing import (apply_processors, apply_sampling_filters,
                                             grammar_bitmask_words)
from vllm_metal.v1.sampler import Sampler, gumbel_noise
from vllm_metal.v1.sampling_batch import SamplingBatch, splitmix64

# Uniforms are drawn from the top 53 bits of a 64-bit word: the doubles in [0, 1).
_U53 = float(2.0 ** -53)
# Mixed into a seeded row's key so its acceptance uniform is not its draw's key.
_ACCEPT_STREAM = np.uint64(0xA5C3_9E17_7B2D_4F61)


class Verdict(NamedTuple):
    """Per verification row (N rows), lazily computed.

    targets:     int32 [N]  the token the row emits if its draft is refused (greedy:
                 the argmax; sampled: a draw from p_j without d_j)
    draft_probs: float32 [N] p_j(d_j) (0 where there is no draft); None when every row
                 is greedy
    scores:      float32 [N, V] what logprobs are scored from (raw or processed logits)
    """

    targets: mx.array
    draft_probs: mx.array | None
    scores: mx.array


class Accepted(NamedTuple):
    """tokens: per request, what it emits this step (its accepted drafts, then one);
    row_tokens: int32 [N], each row's emitted token (0 on rows past a refusal);
    used: bool [N], rows that emitted a token."""

    tokens: list[list[int]]
    row_tokens: np.ndarray
    used: np.ndarray


def verify(sampler: Sampler, logits: mx.array, batch: SamplingBatch, drafts: np.ndarray,
           grammar_bitmask: np.ndarray | None = None) -> Verdict:
    """logits [N, V_model] of the verification rows; batch: one row per logits row (the
    request's state extended by the drafts before it); drafts int32 [N] (-1: none);
    grammar_bitmask int32 [N, W] or None."""
    vocab = sampler.vocab_size
    if batch.num_rows != logits.shape[0] or drafts.shape != (logits.shape[0],):
        raise ValueError(f"{logits.shape[0]} logits rows, {batch.num_rows} batch rows and "
                         f"{drafts.shape} drafts must agree")
    if batch.vocab_size != vocab:
        raise ValueError(f"batch was built for vocab_size={batch.vocab_size}, "
                         f"sampler has {vocab}")
    if batch.num_rows == 0:
        empty = mx.zeros((0,), dtype=mx.int32)
        return Verdict(empty, None, mx.zeros((0, vocab), dtype=mx.float32))
    # A draft outside the vocabulary is no token the target could emit: refused.
    drafts = np.where(drafts < vocab, drafts, -1).astype(np.int32)
    if logits.shape[1] != vocab:
        logits = logits[:, :vocab]
    raw = logits.astype(mx.float32)
    processed_scores = (batch.num_logprobs is not None
                        and sampler.logprobs_mode.startswith("processed"))
    if batch.all_greedy:
        allowed = None
        if grammar_bitmask is not None and sampler.cpu_kernel and batch.unprocessed:
            allowed, grammar_bitmask = grammar_bitmask_words(grammar_bitmask), None
        processed = apply_processors(raw, batch, grammar_bitmask)
        targets = sampler.argmax(processed, sampler.cpu_kernel, allowed).astype(mx.int32)
        return Verdict(targets, None, processed if processed_scores else raw)

    filtered = apply_sampling_filters(apply_processors(raw, batch, grammar_bitmask), batch,
                                      sampler.top_p_candidates)
    has_draft = drafts >= 0
    draft_ids = mx.array(np.maximum(drafts, 0).astype(np.int32))
    lse = mx.logsumexp(filtered, axis=-1)
    chosen = mx.take_along_axis(filtered, draft_ids[:, None], axis=-1)[:, 0]
    draft_probs = mx.where(mx.array(has_draft), mx.exp(chosen - lse), 0.0)
    # Sampled rows draw without their draft; greedy rows keep it (their argmax is
    # the draft exactly when the draft is accepted).
    ban = mx.array(has_draft & ~batch.greedy)[:, None]
    column = mx.arange(vocab, dtype=mx.int32)[None, :]
    residual = mx.where(ban & (column == draft_ids[:, None]), -np.inf, filtered)
    keys = sampler.keys(batch)
    if sampler.cpu_kernel:
        # filtered already holds the temperature: draw at 1 (greedy rows: argmax).
        temperature = np.where(batch.greedy, 0.0, 1.0).astype(np.float32)
        targets = sample_tokens(residual, mx.array(temperature), keys)
    else:
        noise = mx.where(mx.array(batch.greedy)[:, None], 0.0, gumbel_noise(keys, vocab))
        targets = mx.argmax(residual + noise, axis=-1)
    return Verdict(targets.astype(mx.int32), draft_probs.astype(mx.float32),
                   filtered if processed_scores else raw)


def acceptance_uniforms(batch: SamplingBatch, rng: np.random.Generator) -> np.ndarray:
    """float64 [N] in [0, 1): seeded rows' from their seed and position (the same in any
    batch), the others' from ``rng``."""
    u = rng.random(batch.num_rows)
    if batch.seeded_rows.any():
        keys = batch.seeded_keys.astype(np.uint64)
        with np.errstate(over="ignore"):
            words = splitmix64((keys[:, 0] << np.uint64(32) | keys[:, 1]) ^ _ACCEPT_STREAM)
        seeded = (words >> np.uint64(11)).astype(np.float64) * _U53
        u = np.where(batch.seeded_rows, seeded, u)
    return u


def accept(drafts: np.ndarray, cu_rows: np.ndarray, targets: np.ndarray,
           draft_probs: np.ndarray | None, greedy: np.ndarray,
           uniforms: np.ndarray | None) -> Accepted:
    """Apply the rule. drafts int32 [N]; cu_rows int [R + 1] (request r owns rows
    cu_rows[r] .. cu_rows[r + 1] - 1, its last the bonus row); targets int [N] and
    draft_probs float [N] (None: all greedy) from a Verdict; greedy bool [N];
    uniforms float [N] (acceptance_uniforms; None: all greedy)."""
    n = len(drafts)
    counts = np.diff(cu_rows)
    if (len(cu_rows) < 1 or cu_rows[0] != 0 or cu_rows[-1] != n or (counts < 1).any()
            or len(targets) != n or (draft_probs is not None and len(draft_probs) != n)):
        raise ValueError(f"cu_rows {list(cu_rows)} must split the {n} rows (targets "
                         f"{len(targets)}) into requests of at least one row each")
    if draft_probs is None:
        ok = targets == drafts
    else:
        # p_j(d_j) = 1 leaves nothing to draw from instead, and a uniform in [0, 1)
        # never refuses it.
        ok = np.where(greedy, targets == drafts,
                      (uniforms < draft_probs) | (draft_probs >= 1.0))
    ok &= drafts >= 0
    tokens: list[list[int]] = []
    row_tokens = np.zeros(len(drafts), dtype=np.int32)
    used = np.zeros(len(drafts), dtype=bool)
    for start, end in zip(cu_rows[:-1].tolist(), cu_rows[1:].tolist()):
        stop = start
        while stop < end - 1 and ok[stop]:
            stop += 1
        row_tokens[start:stop] = drafts[start:stop]
        row_tokens[stop] = targets[stop]
        used[start:stop + 1] = True
        tokens.append(row_tokens[start:stop + 1].tolist())
    return Accepted(tokens, row_tokens, used)
