"""Per-row numpy float64 references of vLLM's sampling semantics, for the sampler's
and the rejection rule's tests."""

from collections import Counter

import numpy as np

NEG_INF = -np.inf


def ref_log_softmax(x):
    finite = x[np.isfinite(x)]
    m = finite.max()
    return x - (m + np.log(np.exp(finite - m).sum()))


def ref_process(raw, params, prompt, output, bitmask_row=None):
    """Raw logits [V] -> logits after grammar, masks, bias and penalties (vLLM's order)."""
    x = raw.astype(np.float64).copy()
    vocab = len(x)
    if bitmask_row is not None:
        for t in range(vocab):
            if not (int(bitmask_row[t // 32]) >> (t % 32)) & 1:
                x[t] = NEG_INF
    if params.allowed_token_ids is not None:
        keep = set(params.allowed_token_ids)
        x[[t for t in range(vocab) if t not in keep]] = NEG_INF
    for word in params.bad_words_token_ids or []:
        n = len(word) - 1
        if n <= len(output) and (n == 0 or list(output[-n:]) == list(word[:-1])):
            x[word[-1]] = NEG_INF
    if len(output) < params.min_tokens:
        y = x.copy()
        y[list(params.all_stop_token_ids)] = NEG_INF
        if np.isfinite(y).any():
            x = y
    for t, b in (params.logit_bias or {}).items():
        x[t] += b
    for t in set(prompt) | set(output):
        r = params.repetition_penalty
        x[t] = x[t] / r if x[t] > 0 else x[t] * r
    for t, c in Counter(output).items():
        x[t] -= params.frequency_penalty * c + params.presence_penalty
    return x


def ref_filter(x, params):
    """Processed logits -> temperature-scaled, min_p/top-k/top-p filtered logits."""
    if params.temperature < 1e-5:
        return x
    x = x / params.temperature
    if params.min_p > 0:
        p = np.exp(ref_log_softmax(x))
        x = np.where(p < params.min_p * p.max(), NEG_INF, x)
    if 0 < params.top_k < len(x):
        kth = np.sort(x)[::-1][params.top_k - 1]
        x = np.where(x < kth, NEG_INF, x)
    if params.top_p < 1:
        p = np.exp(ref_log_softmax(x))
        order = np.argsort(-p, kind="stable")
        mass_before = np.cumsum(p[order]) - p[order]
        drop = order[mass_before >= params.top_p]
        x = x.copy()
        x[drop] = NEG_INF
    return x
