"""EncoderRunner: the model runner of a BERT-class pooling model.

vLLM schedules a bidirectional model's prompts whole (it turns chunked prefill and
prefix caching off for them) and plans it no KV cache, so a step is: the scheduled
requests' tokens packed in the step's order through the encoder (each attending to
its own), and vLLM's pooler over them (vllm_metal.v1.pooling).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

from vllm_metal.models.encoder import load_encoder
from vllm_metal.pytorch_backend.tensor_bridge import mlx_dtype_from_torch
from vllm_metal.v1.classifier import encoder_classifier
from vllm_metal.v1.pooling import Pooling

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput

    from vllm_metal.backend import Backend

logger = logging.getLogger("vllm_metal")


class _Loaded:
    """What the worker reads of a loaded model (its parameters' bytes)."""

    def __init__(self, model) -> None:
        self.model = model


class EncoderRunner:
    def __init__(self, vllm_config: VllmConfig, backend: Backend, mlx_group=None) -> None:
        self.vllm_config = vllm_config
        self.backend = backend
        self.model_config = vllm_config.model_config
        self.block_size = vllm_config.cache_config.block_size
        self.max_model_len = self.model_config.max_model_len
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.loaded: _Loaded | None = None
        self.pooling: Pooling | None = None
        # What the worker asks of every runner: an encoder has none of them.
        self.lora = self.connector = self.drafter = None

    def load_model(self) -> None:
        dtype = mlx_dtype_from_torch(self.model_config.dtype)
        model, heads = load_encoder(self.model_config.model, dtype)
        # The backend's linears (on the CPU: its SIMD kernels, where MLX's float32
        # matmul took 7 s for 100 tokens of a BERT-base against torch's 0.2 s).
        self.backend.prepare_weights(model)
        self.loaded = _Loaded(model)
        pooling, classifier = encoder_classifier(self.model_config, heads)
        self.pooling = Pooling(self.vllm_config, classifier, pooling)
        c = model.config
        logger.info("Loaded %s encoder: %d layers, %d heads, hidden %d, %s, %s", c.model_type,
                    c.num_layers, c.num_heads, c.hidden_size, dtype,
                    "classifier" if classifier is not None else "embeddings")

    def get_kv_cache_spec(self) -> dict:
        return {}   # attention over a request's own tokens, recomputed each time

    def initialize_kv_cache(self, kv_cache_config) -> None:
        return None

    def execute_model(self, scheduler_output: SchedulerOutput, intermediate_tensors=None):
        pooling = self.pooling
        for req_id in scheduler_output.finished_req_ids:
            pooling.remove_request(req_id)
        for new in scheduler_output.scheduled_new_reqs:
            if new.pooling_params is None or new.prompt_token_ids is None:
                raise ValueError(f"request {new.req_id}: an encoder serves pooling requests "
                                 "of token ids only")
            pooling.add_request(new.req_id, new.pooling_params, list(new.prompt_token_ids))
        scheduled = scheduler_output.num_scheduled_tokens
        req_ids = list(scheduled)
        if not req_ids:
            return EMPTY_MODEL_RUNNER_OUTPUT
        lengths = []
        for req_id in req_ids:
            if scheduled[req_id] != len(pooling.prompt(req_id)):
                # vLLM schedules bidirectional prompts whole; a part would be a prompt
                # this encoder never saw.
                raise RuntimeError(f"request {req_id}: {scheduled[req_id]} of its "
                                   f"{len(pooling.prompt(req_id))} tokens scheduled; an "
                                   "encoder runs whole prompts")
            lengths.append(scheduled[req_id])
        ids = mx.array(np.concatenate([pooling.prompt(r) for r in req_ids]).astype(np.int32))
        types = [self._token_types(r, n) for r, n in zip(req_ids, lengths)]
        token_types = None if all(t is None for t in types) else mx.array(np.concatenate([
            np.zeros(n, np.int32) if t is None else t for t, n in zip(types, lengths)]))
        with self.backend.encoder_context():   # the graph is built here: its kernels
            hidden = self.loaded.model(ids, lengths, token_types)
        cu = np.concatenate([[0], np.cumsum(lengths)])
        output = ModelRunnerOutput(req_ids=req_ids,
                                   req_id_to_index={r: i for i, r in enumerate(req_ids)})
        output.pooler_output = pooling.pool(req_ids, cu, np.array(lengths), hidden)
        return output

    def _token_types(self, req_id: str, length: int) -> np.ndarray | None:
        """int32 [length]: a pair's token types (1 over its second text; vLLM's front
        end sends the span as ``compressed_token_type_ids`` (start, end) in the
        pooling params), None for a single text."""
        extra = self.pooling.params(req_id).extra_kwargs or {}
        span = extra.get("compressed_token_type_ids")
        if span is None:
            return None
        positions = np.arange(length)
        start, end = span
        return ((positions >= start) & (positions < end)).astype(np.int32)

    def sample_tokens(self, grammar_output):
        return EMPTY_MODEL_RUNNER_OUTPUT   # every step's output came from execute_model

    def take_draft_token_ids(self):
        return None

    def kv_bytes_per_block(self) -> int:
        return 0
