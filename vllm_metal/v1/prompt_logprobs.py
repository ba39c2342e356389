"""Prompt logprobs across chunked prefill: one row per prompt position but the last."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
import torch
from vllm.v1.outputs import LogprobsTensors

from vllm_metal.v1.input_batch import RequestState, StepInputs


@dataclass
class _InProgress:
    num_logprobs: int
    tensors: LogprobsTensors  # [prompt_len - 1, num_logprobs + 1]


class PromptLogprobsTracker:
    """Collects prompt logprobs chunk by chunk; hands them out when the prompt is done."""

    def __init__(self, vocab_size: int, logprobs_mode: str, cpu_kernel: bool = True) -> None:
        self.vocab_size = vocab_size
        self.logprobs_mode = logprobs_mode
        self.cpu_kernel = cpu_kernel  # as Sampler's
        self._pending: dict[str, _InProgress] = {}

    def add_request(self, state: RequestState) -> None:
        k = None if state.sampling_params is None else state.sampling_params.prompt_logprobs
        if k is None or len(state.prompt_token_ids) == 0:
            return
        k = self.vocab_size if k == -1 else int(k)
        positions = max(len(state.prompt_token_ids) - 1, 0)
        self._pending[state.req_id] = _InProgress(k, LogprobsTensors.empty_cpu(positions, k + 1))

    def remove_request(self, req_id: str) -> None:
        self._pending.pop(req_id, None)

    @property
    def active(self) -> bool:
        return bool(self._pending)

    def collect(self, step: StepInputs, requests: dict[str, RequestState],
                hidden: mx.array, logits_fn: Callable[[mx.array], mx.array],
                ) -> dict[str, LogprobsTensors | None]:
        """hidden [total_q, hidden]: this step's final hidden states, packed."""
        from vllm_metal.v1.sampler import compute_prompt_logprobs

        done: dict[str, LogprobsTensors | None] = {}
        index = {r: i for i, r in enumerate(step.req_ids)}
        for req_id, pending in list(self._pending.items()):
            i = index.get(req_id)
            if i is None:
                continue
            state = requests[req_id]
            prompt = state.prompt_token_ids
            q_start = int(step.cu_seqlens_q[i])
            q_len = int(step.cu_seqlens_q[i + 1]) - q_start
            start = int(step.positions[q_start])
            remaining = len(prompt) - (start + 1)
            num_rows = min(q_len, remaining)
            if q_len > remaining:
                done[req_id] = pending.tensors
                del self._pending[req_id]
            if num_rows <= 0:
                continue
            logits = logits_fn(hidden[q_start:q_start + num_rows]).astype(mx.float32)
            targets = mx.array(np.asarray(prompt[start + 1:start + 1 + num_rows], dtype=np.int32))
            ids, lps, ranks = compute_prompt_logprobs(
                logits, targets, pending.num_logprobs, self.logprobs_mode,
                cpu_kernel=self.cpu_kernel)
            rows = slice(start, start + num_rows)
            pending.tensors.logprob_token_ids[rows] = torch.from_numpy(
                np.array(ids, dtype=np.int32))
            pending.tensors.logprobs[rows] = torch.from_numpy(np.array(lps, dtype=np.float32))
            pending.tensors.selected_token_ranks[rows] = torch.from_numpy(
                np.array(ranks).astype(np.int32))
        return done
