"""Where drafts come from: after a step, each request that sampled gets up to k drafts,
which vLLM's scheduler schedules into the next step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import mlx.core as mx
import numpy as np

from vllm_metal.attention.caches.paged_kv_cache import PagedKVCache
from vllm_metal.v1.input_batch import StepInputs
from vllm_metal.v1.packed_forward import packed_forward

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from vllm_metal.backend import Backend
    from vllm_metal.v1.input_batch import InputBatch
    from vllm_metal.v1.model_lifecycle import LoadedModel


class Drafter(Protocol):
    def propose(self, batch: InputBatch, req_ids: list[str]) -> list[list[int]]:
        """Up to k drafts for each of ``req_ids`` (rows of ``batch`` holding every
        token they have so far); [] where there is none."""

    def forget(self, req_id: str) -> None:
        """The request finished or lost its blocks (preemption)."""

    def bytes_per_block(self, block_size: int, kv_dtype: mx.Dtype) -> int:
        """Bytes of the drafter's own K/V per block id (0: it keeps none)."""

    def initialize_cache(self, num_blocks: int, block_size: int, kv_dtype: mx.Dtype,
                         group: int) -> PagedKVCache:
        """Make the drafter's cache (only when bytes_per_block > 0): ``num_blocks`` blocks
        addressed by the target's block table of KV cache group ``group``."""

    def parameter_bytes(self) -> int:
        """Bytes of the drafter's own weights."""


class NgramDrafter:
    """Prompt lookup by vLLM's own proposer: the tokens that followed the longest
    earlier match (prompt_lookup_min..max tokens) of the sequence's end."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        self.k = vllm_config.speculative_config.num_speculative_tokens
        self._proposer = NgramProposer(vllm_config)  # compiles its matcher once

    def propose(self, batch: InputBatch, req_ids: list[str]) -> list[list[int]]:
        # The proposer reads rows of a [rows, max_model_len] token array by index:
        # it is given the batch's own array, and an empty entry for rows not asked.
        wanted = [[] for _ in range(batch.max_num_reqs)]
        rows = [batch.row_of.get(r) for r in req_ids]
        for row in rows:
            if row is not None:
                wanted[row] = [0]
        drafts = self._proposer.propose(self.k, wanted, batch.num_tokens, batch.token_ids)
        return [list(map(int, drafts[row])) if row is not None else [] for row in rows]

    def forget(self, req_id: str) -> None:
        return None

    def bytes_per_block(self, block_size: int, kv_dtype: mx.Dtype) -> int:
        return 0

    def initialize_cache(self, num_blocks: int, block_size: int, kv_dtype: mx.Dtype,
                         group: int) -> PagedKVCache:
        raise ValueError("the n-gram drafter keeps no cache")

    def parameter_bytes(self) -> int:
        return 0


class DraftModelDrafter:
    """A second, smaller model of the same vocabulary drafts k tokens by its argmax.

    Its K/V live in a cache of its own with the target's block count and size, indexed
    by the target's block table of ``group`` (a full-attention group), so vLLM's block
    manager places, frees and preempts both alike; the scheduler reserves k slots past
    each request's tokens for the draft's lookahead. The draft's cache is filled lazily:
    before proposing, it runs over a request's tokens past the longest prefix it has
    already seen (a whole prompt the first time; after a step, the tokens the target
    accepted and the one it sampled), then k - 1 single-token steps.
    """

    def __init__(self, vllm_config: VllmConfig, model: LoadedModel, vocab_size: int,
                 key_columns: bool = False) -> None:
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.model = model
        self.key_columns = key_columns  # the backend's (PagedKVCache)
        self.vocab_size = vocab_size
        self.cache: PagedKVCache | None = None
        self.group = 0
        # Per request: the tokens whose K/V the draft's cache holds, from position 0.
        self._seen: dict[str, np.ndarray] = {}

    def bytes_per_block(self, block_size: int, kv_dtype: mx.Dtype) -> int:
        d = self.model.dims
        return PagedKVCache.bytes_per_block(d.num_layers, block_size, d.num_kv_heads,
                                            d.head_dim, kv_dtype, latent=d.latent)

    def initialize_cache(self, num_blocks: int, block_size: int, kv_dtype: mx.Dtype,
                         group: int) -> PagedKVCache:
        d = self.model.dims
        self.cache = PagedKVCache(d.num_layers, num_blocks, block_size, d.num_kv_heads,
                                  d.head_dim, kv_dtype, latent=d.latent,
                                  key_columns=self.key_columns)
        self.group = group
        return self.cache

    def parameter_bytes(self) -> int:
        from vllm_metal.v1.model_lifecycle import parameter_bytes

        return parameter_bytes(self.model.model)

    def forget(self, req_id: str) -> None:
        self._seen.pop(req_id, None)

    def propose(self, batch: InputBatch, req_ids: list[str]) -> list[list[int]]:
        bs = batch.block_size
        rows, starts, ends, budgets = [], [], [], []
        for req_id in req_ids:
            row = batch.row_of.get(req_id)
            n = 0 if row is None else int(batch.num_tokens[row])
            # Lookahead slots exist as far as the request's blocks reach.
            room = len(batch.requests[req_id].block_ids[self.group]) * bs - n + 1
            budget = min(self.k, room, batch.max_model_len - n)
            if row is None or budget < 1:
                rows.append(None)
                continue
            tokens = batch.token_ids[row, :n]
            seen = self._seen.get(req_id, tokens[:0])
            m = min(len(seen), n - 1)
            differs = np.flatnonzero(seen[:m] != tokens[:m])
            start = int(differs[0]) if len(differs) else m
            rows.append(row)
            starts.append(start)
            ends.append(n)
            budgets.append(budget)
        live = [i for i, row in enumerate(rows) if row is not None]
        drafts: list[list[int]] = [[] for _ in req_ids]
        if not live:
            return drafts
        table = batch.block_table[self.group, [rows[i] for i in live]]
        starts_a, ends_a = np.array(starts), np.array(ends)
        # First pass: each request's unseen tokens, the last of which predicts draft 0.
        tokens = np.concatenate([batch.token_ids[rows[i], s:e]
                                 for i, s, e in zip(live, starts, ends)])
        last = self._step(tokens, starts_a, ends_a - starts_a, table, bs)
        step_budget = np.array(budgets)
        out = [[int(t)] for t in last]
        positions = ends_a.copy()
        for j in range(1, self.k):
            going = np.flatnonzero(step_budget > j)
            if not len(going):
                break
            feed = np.array([out[g][-1] for g in going], dtype=np.int32)
            nxt = self._step(feed, positions[going], np.ones(len(going), np.int64),
                             table[going], bs)
            positions[going] += 1
            for g, t in zip(going.tolist(), nxt.tolist()):
                out[g].append(int(t))
        for g, i in enumerate(live):
            row = rows[i]
            drafts[i] = out[g]
            # The cache now holds the request's tokens and every draft but the last.
            self._seen[req_ids[i]] = np.concatenate(
                [batch.token_ids[row, :ends[g]], np.asarray(out[g][:-1], np.int32)])
        return drafts

    def _step(self, tokens: np.ndarray, starts: np.ndarray, q_lens: np.ndarray,
              table: np.ndarray, block_size: int) -> np.ndarray:
        """One packed draft forward: request i's q_lens[i] tokens from position starts[i]
        -> the argmax after each request's last token, int64 [num_reqs]."""
        step = StepInputs.of_spans([""] * len(q_lens), tokens, starts, q_lens, table,
                                   block_size)
        hidden = packed_forward(self.model, step, self.cache)[mx.array(step.logits_indices)]
        ids = self.model.greedy_tokens(hidden, self.vocab_size)
        if ids is None:
            ids = mx.argmax(self.model.logits(hidden)[:, :self.vocab_size], axis=-1)
        return np.array(ids).astype(np.int64)


def make_drafter(vllm_config: VllmConfig, backend: Backend, dtype: mx.Dtype,
                 vocab_size: int) -> Drafter | None:
    spec = vllm_config.speculative_config
    if spec is None:
        return None
    if spec.method == "ngram":
        return NgramDrafter(vllm_config)
    if spec.method == "draft_model":
        from vllm_metal.v1.model_lifecycle import load_model

        path = spec.draft_model_config.model
        model = load_model(path, dtype, backend)
        if model.dims.vocab_size < vocab_size:
            raise ValueError(
                f"--speculative-config: the draft model {path} has {model.dims.vocab_size} "
                f"tokens, the target {vocab_size}; use a draft of the target's tokenizer")
        if any(e.state is not None for e in model.adapter.entries):
            raise ValueError(f"--speculative-config: the draft model {path} has recurrent "
                             "layers; use an attention-only draft")
        return DraftModelDrafter(vllm_config, model, vocab_size, key_columns=backend.key_columns)
    raise ValueError(f"--speculative-config method {spec.method!r} has no drafter")
