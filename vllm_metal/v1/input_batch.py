"""Persistent per-request state and the vectorized per-step input builder."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from vllm_metal.v1.sampling_batch import RequestSamplingState

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.pooling_params import PoolingParams
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.output import SchedulerOutput


@dataclass
class RequestState:
    """What the runner keeps of one live request between steps."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams | None   # None: a pooling request
    block_ids: list[list[int]]   # per KV cache group
    num_computed_tokens: int
    lora_request: LoRARequest | None = None  # its adapter; None: the base model
    pooling_params: PoolingParams | None = None
    sampling: RequestSamplingState | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.sampling = (None if self.sampling_params is None else
                         RequestSamplingState(self.sampling_params, self.prompt_token_ids))

    @property
    def output_token_ids(self) -> list[int]:
        """Tokens this runner sampled; vLLM does not send them back on decode steps.
        A pooling request's list is empty, always (a fresh one each time)."""
        return [] if self.sampling is None else self.sampling.output_token_ids

    @output_token_ids.setter
    def output_token_ids(self, tokens: list[int]) -> None:
        if self.sampling is None:
            if tokens:
                raise ValueError(f"request {self.req_id} pools its prompt and samples nothing")
            return
        self.sampling.output_token_ids = tokens

    @property
    def lora_id(self) -> int:
        """vLLM's lora_int_id of its adapter; 0 for the base model."""
        return self.lora_request.lora_int_id if self.lora_request is not None else 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


@dataclass
class StepInputs:
    """Host-side inputs of one packed forward (numpy, built without per-token Python).

    req_ids:        [num_reqs]            scheduled requests, in scheduler order
    input_ids:      int32 [total_q]
    positions:      int32 [total_q]
    cu_seqlens_q:   int32 [num_reqs + 1]
    seq_lens:       int32 [num_reqs]      context length after this step
    block_tables:   int32 [num_groups, num_reqs, max_blocks]  one table per KV cache group
    slot_mapping:   int32 [num_groups, total_q]
    sample_mask:    bool  [num_reqs]      request reaches the end of its known tokens
    logits_indices: int32 [num_rows]      packed rows the head reads: each sampling
                                          request's last token, and before it the
                                          rows of its drafts
    num_drafts:     int32 [num_reqs]      draft tokens ending each request's query
                                          (None: a step without drafts)
    mrope:          int32 [3, total_q]    M-RoPE positions of each row (models.mrope;
                                          None: the model rotates at ``positions``)
    rope_angles:    float32 [2, total_q, rope_dims / 2]  cos, sin of mrope's angles
    key_ends:       int32 [total_q]       rows of an image span attending to the whole
                                          span (a prefix-LM's): one past its last
                                          position; 0 elsewhere (None: no such row)
    """

    req_ids: list[str]
    input_ids: np.ndarray
    positions: np.ndarray
    cu_seqlens_q: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    slot_mapping: np.ndarray
    sample_mask: np.ndarray
    logits_indices: np.ndarray
    num_drafts: np.ndarray | None = None
    mrope: np.ndarray | None = None
    rope_angles: np.ndarray | None = None
    key_ends: np.ndarray | None = None

    @property
    def sampling_req_ids(self) -> list[str]:
        return [r for r, s in zip(self.req_ids, self.sample_mask) if s]

    @classmethod
    def of_spans(cls, req_ids: list[str], tokens: np.ndarray, starts: np.ndarray,
                 q_lens: np.ndarray, tables: np.ndarray, block_size: int) -> StepInputs:
        """Inputs outside vLLM's schedule (profiling, a draft model's steps): request i
        runs its q_lens[i] tokens of ``tokens`` from position starts[i] over its row
        of ``tables`` (one group, int32 [num_reqs, blocks]); each samples its last."""
        cu = np.zeros(len(q_lens) + 1, dtype=np.int32)
        np.cumsum(q_lens, out=cu[1:])
        req_of = np.repeat(np.arange(len(q_lens)), q_lens)
        positions = (starts[req_of] + np.arange(int(cu[-1])) - cu[:-1][req_of]).astype(np.int32)
        seq_lens = (starts + q_lens).astype(np.int32)
        tables = np.ascontiguousarray(tables[:, :-(-int(seq_lens.max()) // block_size)])
        slots = (tables[req_of, positions // block_size] * block_size
                 + positions % block_size).astype(np.int32)
        return cls(req_ids, tokens.astype(np.int32), positions, cu, seq_lens, tables[None],
                   slots[None], np.ones(len(q_lens), bool), (cu[1:] - 1).astype(np.int32))


# Requests up to which a decode step's inputs are built from Python scalars.
_SCALAR_DECODE_MAX = 16


class InputBatch:
    """Rows of token ids and block tables that persist across steps.

    A request keeps its row from its first schedule until it finishes; rows of
    requests that were not scheduled are reclaimed only when rows run out.
    """

    def __init__(self, max_num_reqs: int, max_model_len: int, block_size: int,
                 num_groups: int = 1) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.max_blocks_per_req = -(-max_model_len // block_size)
        # np.zeros maps untouched pages lazily, so a long max_model_len is cheap.
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.set_num_groups(num_groups)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed = np.zeros(max_num_reqs, dtype=np.int32)
        self.requests: dict[str, RequestState] = {}
        self.row_of: dict[str, int] = {}
        self._free_rows = list(range(max_num_reqs - 1, -1, -1))

    def set_block_size(self, block_size: int) -> None:
        """A block size vLLM settled after load (a hybrid's states fit its blocks).
        Before any request."""
        self.block_size = block_size
        self.max_blocks_per_req = -(-self.max_model_len // block_size)
        self.set_num_groups(self.num_groups)

    def reserve_blocks(self, tokens: int) -> None:
        """Room in every table for ``tokens`` tokens' blocks (an encoder-decoder's
        cross-attention blocks hold the encoder's rows, which may outnumber
        max_model_len). Before any request."""
        self.max_blocks_per_req = max(self.max_blocks_per_req, -(-tokens // self.block_size))
        self.set_num_groups(self.num_groups)

    def set_num_groups(self, num_groups: int) -> None:
        """One block table per KV cache group (vLLM's hybrid cache: full and
        sliding-window layers get their blocks separately). Before any request."""
        self.num_groups = num_groups
        self.block_table = np.zeros((num_groups, self.max_num_reqs, self.max_blocks_per_req),
                                    dtype=np.int32)

    # -- request lifecycle -------------------------------------------------

    def add_request(self, state: RequestState) -> None:
        self.requests[state.req_id] = state

    def remove_request(self, req_id: str) -> None:
        self.requests.pop(req_id, None)
        self._release_row(req_id)

    def apply_schedule(self, scheduler_output: SchedulerOutput) -> None:
        """Make every scheduled request's row match its state."""
        scheduled = scheduler_output.num_scheduled_tokens
        for req_id in scheduled:
            state = self.requests[req_id]
            row = self.row_of.get(req_id)
            if row is None:
                row = self._take_row(scheduled)
                self.row_of[req_id] = row
                self._write_tokens(row, state, 0)
                for group, blocks in enumerate(state.block_ids):
                    self._write_group_blocks(row, group, blocks, 0)
            self.num_computed[row] = state.num_computed_tokens

    def reset_row(self, req_id: str) -> None:
        """Forget a request's row content (preemption replaced its blocks/tokens)."""
        self._release_row(req_id)

    def append_blocks(self, req_id: str, new_block_ids: tuple[list[int], ...]) -> None:
        """new_block_ids: the blocks each KV cache group added."""
        state = self.requests[req_id]
        row = self.row_of.get(req_id)
        for group, new in enumerate(new_block_ids):
            start = len(state.block_ids[group])
            state.block_ids[group].extend(new)
            if row is not None:
                self._write_group_blocks(row, group, new, start)

    def append_token(self, req_id: str, token_id: int) -> None:
        state = self.requests[req_id]
        state.output_token_ids.append(token_id)
        row = self.row_of.get(req_id)
        if row is not None:
            n = int(self.num_tokens[row])
            if n < self.max_model_len:
                self.token_ids[row, n] = token_id
                self.num_tokens[row] = n + 1

    def set_drafts(self, req_id: str, drafts: list[int]) -> None:
        """Write a request's scheduled drafts after its known tokens, where its step's
        query reads them; they stay out of num_tokens until accepted. vLLM's padding
        drafts (-1) are read as token 0: they are refused whatever the row says."""
        row = self.row_of[req_id]
        n = int(self.num_tokens[row])
        end = min(n + len(drafts), self.max_model_len)
        self.token_ids[row, n:end] = np.maximum(np.asarray(drafts[:end - n], np.int32), 0)

    def set_token(self, req_id: str, position: int, token_id: int) -> None:
        """Overwrite the token at ``position`` of a request's row (placeholder fill)."""
        row = self.row_of.get(req_id)
        if row is not None and position < self.max_model_len:
            self.token_ids[row, position] = token_id

    # -- per-step inputs ---------------------------------------------------

    def prepare_inputs(self, scheduler_output: SchedulerOutput) -> StepInputs:
        scheduled = scheduler_output.num_scheduled_tokens
        req_ids = list(scheduled)
        if (len(req_ids) <= _SCALAR_DECODE_MAX
                and scheduler_output.total_num_scheduled_tokens == len(req_ids)):
            return self._decode_inputs(req_ids)
        rows = np.fromiter((self.row_of[r] for r in req_ids), dtype=np.int64, count=len(req_ids))
        q_lens = np.fromiter((scheduled[r] for r in req_ids), dtype=np.int32, count=len(req_ids))

        cu_seqlens_q = np.zeros(len(req_ids) + 1, dtype=np.int32)
        np.cumsum(q_lens, out=cu_seqlens_q[1:])
        total_q = int(cu_seqlens_q[-1])
        req_of_token = np.repeat(np.arange(len(req_ids)), q_lens)
        computed = self.num_computed[rows]
        positions = (computed[req_of_token]
                     + np.arange(total_q, dtype=np.int32)
                     - cu_seqlens_q[:-1][req_of_token]).astype(np.int32)
        input_ids = self.token_ids[rows[req_of_token], positions]

        seq_lens = (computed + q_lens).astype(np.int32)
        max_blocks = -(-int(seq_lens.max()) // self.block_size)
        block_tables = self.block_table[:, rows, :max_blocks]
        pages = block_tables[:, req_of_token, positions // self.block_size]
        slot_mapping = (pages * self.block_size + positions % self.block_size).astype(np.int32)

        sample_mask = seq_lens >= self.num_tokens[rows]
        logits_indices = (cu_seqlens_q[1:] - 1)[sample_mask].astype(np.int32)
        num_drafts = None
        drafts = scheduler_output.scheduled_spec_decode_tokens
        if drafts:
            num_drafts = np.fromiter((len(drafts.get(r, ())) for r in req_ids),
                                     dtype=np.int32, count=len(req_ids))
            logits_indices = _draft_rows(cu_seqlens_q[1:][sample_mask],
                                         num_drafts[sample_mask])
        return StepInputs(req_ids, input_ids, positions, cu_seqlens_q, seq_lens,
                          np.ascontiguousarray(block_tables), slot_mapping,
                          sample_mask, logits_indices, num_drafts)

    def _decode_inputs(self, req_ids: list[str]) -> StepInputs:
        """prepare_inputs for a few requests of one token each, from per-request
        scalars. This runs beside a forward that streams the weights through the
        caches, where every numpy call costs microseconds: the general path took 20 us
        alone and 100-200 us right after a decode step; this one makes eight calls
        (6 us alone for one request, level with the general path at ~24)."""
        bs = self.block_size
        table = self.block_table
        rows, positions, tokens, slots, sample = [], [], [], [], []
        for req_id in req_ids:
            row = self.row_of[req_id]
            pos = int(self.num_computed[row])
            rows.append(row)
            positions.append(pos)
            tokens.append(self.token_ids[row, pos])
            slots.append([int(table[g, row, pos // bs]) * bs + pos % bs
                          for g in range(self.num_groups)])
            sample.append(pos + 1 >= self.num_tokens[row])
        n = len(req_ids)
        seq_lens = [p + 1 for p in positions]
        return StepInputs(
            req_ids,
            np.array(tokens, dtype=np.int32),
            np.array(positions, dtype=np.int32),
            np.arange(n + 1, dtype=np.int32),
            np.array(seq_lens, dtype=np.int32),
            table[:, rows, :-(-max(seq_lens) // bs)],
            np.array(slots, dtype=np.int32).T.copy(),
            np.array(sample, dtype=bool),
            np.array([i for i in range(n) if sample[i]], dtype=np.int32),
        )

    # -- rows --------------------------------------------------------------

    def _take_row(self, protected: dict[str, int]) -> int:
        if not self._free_rows:
            idle = next((r for r in self.row_of if r not in protected), None)
            if idle is None:
                raise RuntimeError(
                    f"more than {self.max_num_reqs} requests scheduled in one step; "
                    "raise --max-num-seqs")
            self._release_row(idle)
        return self._free_rows.pop()

    def _release_row(self, req_id: str) -> None:
        row = self.row_of.pop(req_id, None)
        if row is not None:
            self.num_tokens[row] = 0
            self._free_rows.append(row)

    def _write_tokens(self, row: int, state: RequestState, start: int) -> None:
        tokens = (state.prompt_token_ids + state.output_token_ids)[: self.max_model_len]
        self.token_ids[row, start:len(tokens)] = tokens[start:]
        self.num_tokens[row] = len(tokens)

    def _write_group_blocks(self, row: int, group: int, block_ids: list[int],
                            start: int) -> None:
        end = start + len(block_ids)
        if end > self.max_blocks_per_req:
            raise RuntimeError(
                f"request needs {end} KV blocks, more than max_model_len allows "
                f"({self.max_blocks_per_req})")
        self.block_table[group, row, start:end] = block_ids


def _draft_rows(ends: np.ndarray, num_drafts: np.ndarray) -> np.ndarray:
    """int32: for each sampling request, whose query ends before packed row ``ends[i]``
    with ``num_drafts[i]`` = k drafts, the k + 1 rows ending its query: the row before
    each draft (which predicts it) and the last row (the bonus token's)."""
    counts = num_drafts + 1
    first = np.repeat(ends - counts, counts)
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return (first + offsets).astype(np.int32)
