"""A step's drafts checked against the target: verification rows -> emitted tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import mlx.core as mx
import numpy as np

from vllm_metal.spec_decode.rejection import accept, acceptance_uniforms, verify
from vllm_metal.v1.logits_processing import grammar_bitmask_words
from vllm_metal.v1.sampling_batch import build_sampling_batch

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import GrammarOutput

    from vllm_metal.v1.input_batch import RequestState
    from vllm_metal.v1.model_lifecycle import LoadedModel
    from vllm_metal.v1.sampler import Sampler


class Verified(NamedTuple):
    """tokens: per sampling request, what it emits (accepted drafts, then one token).
    logprobs: (ids [T, K+1], logprobs [T, K+1], ranks [T]) of the T emitted tokens in
    order, or None."""

    tokens: list[list[int]]
    logprobs: tuple[np.ndarray, np.ndarray, np.ndarray] | None


def verify_drafts(sampler: Sampler, model: LoadedModel, states: list[RequestState],
                  drafts: list[list[int]], hidden_rows: mx.array, logits: mx.array,
                  grammar_output: GrammarOutput | None) -> Verified:
    """states / drafts: the step's sampling requests in order and their scheduled drafts
    (-1: vLLM's padding); hidden_rows [N, hidden] / logits [N, V] (lazy): the head's
    input and output at their N = sum(k + 1) verification rows."""
    counts = np.array([len(d) + 1 for d in drafts], dtype=np.int64)
    cu_rows = np.concatenate([[0], np.cumsum(counts)])
    row_drafts = np.concatenate([np.asarray(d + [-1], dtype=np.int32) for d in drafts])
    rows = []
    for state, d in zip(states, drafts):
        reachable = d[:d.index(-1)] if -1 in d else d   # rows after a pad never emit
        rows += [state.sampling.extended(reachable[:j]) for j in range(len(d) + 1)]
    batch = build_sampling_batch(rows, sampler.vocab_size)
    bitmask = _row_bitmask(grammar_output, states, counts, int(cu_rows[-1]))

    # The forward first, on its own: evaluated together with the head's argmax, the
    # verification step of the bundled model took 14 ms instead of 6 + 1.6.
    mx.eval(hidden_rows)
    targets = None
    if batch.all_greedy_plain:
        allowed = None if bitmask is None else grammar_bitmask_words(bitmask)
        if allowed is None or allowed.shape[1] * 32 >= sampler.vocab_size:
            targets = model.greedy_tokens(hidden_rows, sampler.vocab_size, allowed)
    if targets is not None:
        draft_probs = scores = None
        mx.eval(targets)
    else:
        targets, draft_probs, scores = verify(sampler, logits, batch, row_drafts, bitmask)
        mx.eval(targets, *(() if draft_probs is None else (draft_probs,)))
    host_probs = None if draft_probs is None else np.array(draft_probs)
    uniforms = (None if host_probs is None
                else acceptance_uniforms(batch, sampler.rng))
    accepted = accept(row_drafts, cu_rows, np.array(targets), host_probs, batch.greedy,
                      uniforms)
    logprobs = None
    if batch.num_logprobs is not None:
        lp = sampler.logprobs(scores, mx.array(accepted.row_tokens), batch)
        mx.eval(*lp)
        logprobs = tuple(np.array(a)[accepted.used] for a in lp)
    return Verified(accepted.tokens, logprobs)


def _row_bitmask(grammar_output: GrammarOutput | None, states: list[RequestState],
                 counts: np.ndarray, num_rows: int) -> np.ndarray | None:
    """vLLM's grammar bitmask (a block of 1 + max drafts rows per structured request,
    row j for the token after j drafts) laid out on the verification rows; all ones
    on rows of other requests."""
    if grammar_output is None or not grammar_output.structured_output_request_ids:
        return None
    source = np.asarray(grammar_output.grammar_bitmask, dtype=np.int32)
    ids = grammar_output.structured_output_request_ids
    stride = source.shape[0] // len(ids)
    block_of = {r: i for i, r in enumerate(ids)}
    aligned = np.full((num_rows, source.shape[1]), -1, dtype=np.int32)
    start = 0
    for state, count in zip(states, counts.tolist()):
        block = block_of.get(state.req_id)
        if block is not None:
            aligned[start:start + count] = source[block * stride:block * stride + count]
        start += count
    return aligned
