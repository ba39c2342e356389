"""Pooling: what a --runner pooling engine returns in place of sampled tokens.

The forward is the generating one (the family's backbone over the paged cache, final
norm included); its hidden states go to vLLM's own pooler, built from the model's
pooler config as vLLM builds it for a converted model (pooling method, the
sentence-transformers projector, normalisation, matryoshka ``dimensions``), so the
embeddings follow vLLM's semantics without a copy of them here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np
import torch
from vllm.v1.pool.metadata import PoolingMetadata, PoolingStates

from vllm_metal.pytorch_backend.tensor_bridge import mlx_to_torch

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.pooling_params import PoolingParams


# The --convert values (vLLM's name for how a generating checkpoint becomes a pooling
# one) served here; config_checks refuses the rest before load.
SERVED_CONVERSIONS = ("embed", "classify")


class Pooling:
    """vLLM's pooler for the served model, and each live request's pooling inputs."""

    def __init__(self, vllm_config: VllmConfig, classifier=None, pooling=None) -> None:
        """classifier: torch [B, hidden] -> [B, num_labels] for a classification model
        (vLLM's classify, score and rerank), None for an embedding model; pooling: what
        pools a classifier's input in place of the pooler config's method (a BERT
        classifier's dense layer after its CLS token)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.pooler import DispatchPooler

        pooler_config = vllm_config.model_config.pooler_config
        # vLLM's pooler factories read the current config (head dtype, projector files,
        # the classifier's activation).
        with set_current_vllm_config(vllm_config):
            if classifier is not None:
                self.pooler = DispatchPooler.for_seq_cls(pooler_config, pooling=pooling,
                                                         classifier=classifier)
            else:
                self.pooler = DispatchPooler.for_embedding(pooler_config)
        self._params: dict[str, PoolingParams] = {}
        self._states: dict[str, PoolingStates] = {}
        self._prompts: dict[str, list[int]] = {}

    def supported_tasks(self) -> tuple[str, ...]:
        return tuple(sorted(self.pooler.get_supported_tasks()))

    def add_request(self, req_id: str, params: PoolingParams, prompt: list[int]) -> None:
        if params.task not in self.pooler.get_supported_tasks():
            # vLLM's front end checks the task first; a request reaching here without
            # one the pooler has would fail inside it, far from its cause.
            raise ValueError(f"request {req_id}: pooling task {params.task!r} is not served "
                             f"by this model (it serves {', '.join(self.supported_tasks())})")
        self.pooler.get_pooling_updates(params.task).apply(params)
        self._params[req_id] = params
        self._states[req_id] = PoolingStates()
        self._prompts[req_id] = prompt

    def remove_request(self, req_id: str) -> None:
        self._params.pop(req_id, None)
        self._prompts.pop(req_id, None)
        states = self._states.pop(req_id, None)
        if states is not None:
            states.clean()

    def params(self, req_id: str) -> PoolingParams:
        return self._params[req_id]

    def prompt(self, req_id: str) -> list[int]:
        return self._prompts[req_id]

    def restart(self, req_id: str) -> None:
        """Forget what a request's earlier chunks left (it runs again from its start)."""
        states = self._states.get(req_id)
        if states is not None:
            states.clean()

    def pool(self, req_ids: list[str], cu_seqlens_q: np.ndarray, seq_lens: np.ndarray,
             hidden: mx.array) -> list[torch.Tensor | None]:
        """hidden [total_q, hidden] (lazy) of the scheduled requests' tokens, request i's
        at rows cu_seqlens_q[i]:cu_seqlens_q[i + 1], its context seq_lens[i] tokens
        long after them -> per request, its pooled output once its prompt is complete,
        else None (a chunk before the last)."""
        params = [self._params[r] for r in req_ids]
        prompt_lens = np.array([len(self._prompts[r]) for r in req_ids], dtype=np.int64)
        token_ids = None
        if any(p.requires_token_ids for p in params):
            token_ids = self._padded_prompts(req_ids, prompt_lens)
        meta = PoolingMetadata(
            prompt_lens=torch.from_numpy(prompt_lens),
            prompt_token_ids=token_ids,
            prompt_token_ids_cpu=token_ids,
            pooling_params=params,
            pooling_states=[self._states[r] for r in req_ids],
        )
        meta.build_pooling_cursor(
            np.diff(cu_seqlens_q).astype(np.int64),
            torch.from_numpy(np.asarray(seq_lens, np.int64)),
            device=torch.device("cpu"),
            query_start_loc_gpu=torch.from_numpy(np.asarray(cu_seqlens_q, np.int64)),
        )
        with torch.inference_mode():
            outputs = self.pooler(mlx_to_torch(hidden), meta)
        finished = meta.get_pooling_cursor().get_finished_mask()
        return [out.clone() if done and out is not None else None
                for out, done in zip(outputs, finished)]

    def _padded_prompts(self, req_ids: list[str], lens: np.ndarray) -> torch.Tensor:
        """int64 [num_reqs, max prompt length], padded past each prompt with an id no
        vocabulary has (as vLLM's runner pads them)."""
        out = np.full((len(req_ids), int(lens.max())), np.iinfo(np.int32).max, np.int64)
        for i, r in enumerate(req_ids):
            out[i, :lens[i]] = self._prompts[r]
        return torch.from_numpy(out)
