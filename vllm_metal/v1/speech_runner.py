"""SpeechRunner: the model runner of an encoder-decoder speech model (Whisper).

vLLM schedules such a request as its decoder prompt (``<|startoftranscript|>``,
language, task, ...) with the audio as the request's one encoder input, listed in
``scheduled_encoder_inputs`` in the step that computes the prompt (vLLM never splits
an encoder-decoder prompt). Its KV cache plan has two groups: the decoder layers'
own K/V (full attention) and their cross-attention K/V (``CrossAttentionSpec``:
blocks for the encoder's rows, allocated with the request). In the step that
encodes a request, each layer writes the keys and values of its encoder rows into
the request's cross blocks; every step's queries attend to them there.

Everything else (sampling, log-probabilities, async output, structured outputs) is
the text runner's: this class replaces the model's load, its cache plan and its
forward.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np
from vllm.v1.kv_cache_interface import (CrossAttentionSpec, FullAttentionSpec, KVCacheConfig,
                                        KVCacheSpec)

from vllm_metal.attention.context import AttentionMetadata, ForwardContext, forward_context
from vllm_metal.models.whisper import CrossStep, WhisperModel, load_whisper
from vllm_metal.pytorch_backend.tensor_bridge import mlx_dtype_from_torch, torch_dtype_from_mlx
from vllm_metal.v1.memory_budget import ActivationEstimate
from vllm_metal.v1.model_lifecycle import ModelDims
from vllm_metal.v1.model_runner import MetalModelRunner, _entry_name
from vllm_metal.v1.prompt_logprobs import PromptLogprobsTracker
from vllm_metal.v1.sampler import Sampler

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

    from vllm_metal.attention.caches.paged_kv_cache import PagedKVCache
    from vllm_metal.v1.input_batch import StepInputs

logger = logging.getLogger("vllm_metal")


@dataclass
class _Entry:
    state: None = None   # what the text runner asks of each KV entry: no recurrent state


@dataclass
class _Adapter:
    """The part of ModelAdapter the text runner reads."""

    entries: list[_Entry]
    hidden_size: int
    held: list[int] = field(default_factory=list)


@dataclass
class SpeechModel:
    """A loaded Whisper as the text runner reads a LoadedModel. KV entries: the
    decoder layers' own (0 .. L-1), then their cross-attention ones (L .. 2L-1)."""

    model: WhisperModel
    dims: ModelDims
    dtype: mx.Dtype
    adapter: _Adapter

    def logits(self, hidden: mx.array) -> mx.array:
        return self.model.decoder.logits(hidden)

    def greedy_tokens(self, hidden, vocab_size, allowed=None):
        return None   # the sampler's path


class SpeechRunner(MetalModelRunner):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Each live request's encoder inputs; the step's scheduled ones.
        self.audio: dict[str, list] = {}
        self._scheduled_audio: dict[str, list[int]] = {}
        self._cross_group = 1

    def load_model(self) -> None:
        # config_checks refused what this runner does not do (adapters, drafts, a
        # quantized or offloaded cache, several ranks).
        dtype = mlx_dtype_from_torch(self.model_config.dtype)
        model = load_whisper(self.model_config.model, dtype, self.backend)
        c = model.config
        layers = 2 * c.decoder_layers
        self.loaded = SpeechModel(
            model, ModelDims(layers, c.decoder_heads, c.decoder_heads, c.head_dim,
                             c.vocab_size), dtype,
            _Adapter([_Entry() for _ in range(layers)], c.d_model, list(range(layers))))
        kernels = self.backend.sampling_kernels
        self.sampler = Sampler(c.vocab_size, self.logprobs_mode, cpu_kernel=kernels)
        self.prompt_logprobs = PromptLogprobsTracker(c.vocab_size, self.logprobs_mode,
                                                     cpu_kernel=kernels)
        logger.info("Loaded Whisper: %d encoder and %d decoder layers, d_model %d, %s",
                    c.encoder_layers, c.decoder_layers, c.d_model, dtype)

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        dims = self.loaded.dims
        common = dict(block_size=self.block_size, num_kv_heads=dims.num_kv_heads,
                      head_size=dims.head_dim, dtype=torch_dtype_from_mlx(self.kv_dtype))
        own = dims.num_layers // 2
        return {_entry_name(i): (FullAttentionSpec(**common) if i < own
                                 else CrossAttentionSpec(**common))
                for i in range(dims.num_layers)}

    def kv_bytes_per_request(self) -> int:
        """A max_model_len request's blocks in the self entries and its encoder rows'
        blocks in the cross entries."""
        own = self.loaded.dims.num_layers // 2
        page = self._target_bytes_per_block() // self.loaded.dims.num_layers
        blocks = -(-self.max_model_len // self.block_size)
        rows = self.loaded.model.config.max_source_positions
        return page * own * (blocks + -(-rows // self.block_size))

    @property
    def kv_quant(self):
        return None   # float caches only (config_checks refuses --kv-cache-dtype)

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        super().initialize_kv_cache(kv_cache_config)
        for g, group in enumerate(kv_cache_config.kv_cache_groups):
            if isinstance(group.kv_cache_spec, CrossAttentionSpec):
                self._cross_group = g
        self.input_batch.reserve_blocks(self.loaded.model.config.max_source_positions)

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        super()._update_states(scheduler_output)
        for req_id in scheduler_output.finished_req_ids:
            self.audio.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            self.audio[new.req_id] = list(new.mm_features or ())
        self._scheduled_audio = scheduler_output.scheduled_encoder_inputs

    def profile_run(self) -> ActivationEstimate:
        # The encoder of one clip and a decoder step over its rows: a speech model's
        # activations are small next to its weights and cache.
        c = self.loaded.model.config
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        with self.backend.encoder_context():
            mx.eval(self.loaded.model.encoder(
                mx.zeros((c.num_mel_bins, 2 * c.max_source_positions), self.loaded.dtype)))
        peak = max(mx.get_peak_memory() - before, 0)
        mx.clear_cache()
        return ActivationEstimate(int(peak * 2), 0)

    def _forward(self, step: StepInputs, cache: PagedKVCache,
                 input_ids: mx.array | None = None, state_slots: dict | None = None,
                 merged=None) -> mx.array:
        """The decoder over the step's tokens -> hidden [total_q, d_model] (lazy); the
        audio of requests scheduled for encoding is encoded first."""
        meta = AttentionMetadata(
            positions=mx.array(step.positions), cu_seqlens_q=mx.array(step.cu_seqlens_q),
            seq_lens=mx.array(step.seq_lens),
            block_tables=[mx.array(t) for t in step.block_tables],
            slot_mapping=[mx.array(s) for s in step.slot_mapping])
        ctx = ForwardContext(meta, cache.key_caches, cache.value_caches, cache.groups,
                             key_columns=cache.key_columns)
        cross = self._cross_step(step)
        if input_ids is None:
            input_ids = mx.array(step.input_ids)
        with forward_context(ctx):
            return self.loaded.model.decoder(input_ids, meta.positions, ctx, cross)

    def _cross_step(self, step: StepInputs) -> CrossStep:
        """Each row's cross table and encoder length; the encoder rows of the step's
        newly scheduled audio and their cross slots."""
        model = self.loaded.model
        length = model.config.max_source_positions
        # The whole cross tables (the step's are cut to its longest decoder context).
        batch = self.input_batch
        tables = batch.block_table[self._cross_group,
                                   [batch.row_of[r] for r in step.req_ids],
                                   : -(-length // self.block_size)]
        rows = np.repeat(np.arange(len(step.req_ids)), np.diff(step.cu_seqlens_q))
        cross = CrossStep(tables=mx.array(tables[rows]),
                          lens=mx.full((len(rows),), length, dtype=mx.int32))
        encoded, slots = [], []
        for i, req_id in enumerate(step.req_ids):
            if not self._scheduled_audio.get(req_id):
                continue
            features = self.audio[req_id]
            if len(features) != 1:
                raise ValueError(f"request {req_id}: {len(features)} audio inputs; Whisper "
                                 "takes one")
            data = features[0].data.get_data()
            feats = data["input_features"]
            feats = mx.array(feats.detach().float().numpy()).astype(self.loaded.dtype)
            with self.backend.encoder_context():
                rows_i = model.encoder(feats)
                mx.eval(rows_i)
            encoded.append(rows_i)
            at = np.arange(length)
            slots.append(tables[i][at // self.block_size] * self.block_size
                         + at % self.block_size)
        if encoded:
            cross.encoded = mx.concatenate(encoded)
            cross.slots = mx.array(np.concatenate(slots).astype(np.int32))
        return cross
