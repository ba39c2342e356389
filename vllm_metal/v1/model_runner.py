"""MetalModelRunner: one engine step = update states, prepare inputs, forward, sample."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np
import torch
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheSpec,
                                        MambaSpec, MLAAttentionSpec, SlidingWindowSpec)
from vllm.v1.outputs import (EMPTY_MODEL_RUNNER_OUTPUT, AsyncModelRunnerOutput, DraftTokenIds,
                             KVConnectorOutput, LogprobsLists, ModelRunnerOutput)

from vllm_metal import envs
from vllm_metal.attention.caches.paged_kv_cache import PagedKVCache
from vllm_metal.attention.kv_quant import (PACKED_HEAD_SIZES, STORAGE_DTYPE, KvQuant,
                                           from_cache_dtype)
from vllm_metal.attention.caches.state_pages import (GdnStateShape, block_size_for_states,
                                                    half_page_floats)
from vllm_metal.distributed.pipeline import StageLink
from vllm_metal.distributed.tensor import TensorShard
from vllm_metal.kv_offload.connector_link import ConnectorLink
from vllm_metal.lora.manager import LoRAManager
from vllm_metal.models.deepstack import use_deepstack
from vllm_metal.models.mrope import (RequestRopePositions, RopeAngles, mrope_sections,
                                     use_sectioned_rope)
from vllm_metal.models.vision import load_vision_tower
from vllm_metal.native import get_ops
from vllm_metal.native.constants import KERNEL_BLOCK_SIZES
from vllm_metal.spec_decode.drafters import Drafter, make_drafter
from vllm_metal.spec_decode.support import CACHELESS_METHODS
from vllm_metal.spec_decode.verification import verify_drafts
from vllm_metal.pytorch_backend.tensor_bridge import mlx_dtype_from_torch, torch_dtype_from_mlx
from vllm_metal.v1.encoder_cache import EncoderCache
from vllm_metal.v1.input_batch import InputBatch, StepInputs
from vllm_metal.v1.logits_processing import grammar_bitmask_words
from vllm_metal.v1.memory_budget import ActivationEstimate
from vllm_metal.v1.model_lifecycle import LoadedModel, load_model
from vllm_metal.v1.packed_forward import packed_forward
from vllm_metal.v1.pending_tokens import InflightStep, PendingTokens
from vllm_metal.v1.pooling import Pooling
from vllm_metal.v1.prompt_logprobs import PromptLogprobsTracker
from vllm_metal.v1.request_updates import apply_scheduler_output
from vllm_metal.v1.sampler import Sampler, SamplerResult
from vllm_metal.v1.sampling_batch import SAMPLING_EPS, SamplingBatchCache

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput

    from vllm_metal.backend import Backend

logger = logging.getLogger("vllm_metal")

# --kv-cache-dtype choices other than auto (the model's dtype); config_checks
# refuses the rest.
_KV_CACHE_DTYPES = {name: getattr(mx, name) for name in envs.KV_CACHE_DTYPES if name != "auto"}

# Tokens of the profiling forward whose peak memory is scaled to max_num_batched_tokens.
PROFILE_TOKENS = 64
# MLX's arrays of a forward peak at two or three hidden-sized buffers per token (the
# first forward at a new token count holds one more; seen here: 3 then 2), so the
# profile's measure is taken with room for the third.
ARRAYS_MARGIN = 1.5


@dataclass
class _ForwardedStep:
    """A forward whose logits await sample_tokens."""

    step: StepInputs
    logits: mx.array | None  # [num_sampling, vocab], lazy
    prompt_logprobs: dict
    rows: mx.array | None = None  # [num_sampling, hidden]: the head's input
    kv_output: KVConnectorOutput | None = None  # with a KV connector


class MetalModelRunner:
    def __init__(self, vllm_config: VllmConfig, backend: Backend, mlx_group=None) -> None:
        """``mlx_group``: the engine's MLX group (mx.distributed.Group) when it runs on
        several ranks, which carries a pipeline stage's hidden states."""
        self.vllm_config = vllm_config
        self.mlx_group = mlx_group
        # With --pipeline-parallel-size: this stage's link to its neighbours.
        self.link: StageLink | None = None
        self.backend = backend
        self.model_config = vllm_config.model_config
        self.block_size = vllm_config.cache_config.block_size
        self.max_model_len = self.model_config.max_model_len
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.max_num_batched_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.logprobs_mode = str(getattr(self.model_config, "logprobs_mode", "raw_logprobs"))
        self.input_batch = InputBatch(self.max_num_reqs, self.max_model_len, self.block_size)
        self.loaded: LoadedModel | None = None
        self.kv_cache: PagedKVCache | None = None
        self.sampler: Sampler | None = None
        self.prompt_logprobs: PromptLogprobsTracker | None = None
        self._forwarded: _ForwardedStep | None = None
        self._debug_sync = envs.VLLM_METAL_DEBUG_SYNC
        self._pipeline = envs.VLLM_METAL_DECODE_PIPELINE
        self.pending_tokens = PendingTokens(self.input_batch)
        self._sampling_batches = SamplingBatchCache()
        self.lora: LoRAManager | None = None  # with --enable-lora
        # State entries (a hybrid's recurrent layers) -> their state's shape, from load.
        self._states: dict = {}
        # KV cache groups of recurrent-state entries -> their state block size in
        # tokens (vLLM's mamba_block_size: max_model_len, or block_size in align mode).
        self._state_groups: dict[int, int] = {}
        # With --speculative-config: what proposes drafts, the drafts the step in
        # flight verifies, and the requests that sampled last (they get proposals).
        self.drafter: Drafter | None = None
        self._step_drafts: dict[str, list[int]] = {}
        self._proposal_ids: list[str] = []
        # With --kv-offloading-size / --kv-transfer-config: vLLM's connector.
        self.connector: ConnectorLink | None = None
        # A --runner pooling engine: steps return pooled prompts, never tokens.
        self.pooling: Pooling | None = None
        # A vision-language model: its image encoder's outputs, merged into prompts,
        # and with M-RoPE (Qwen2-VL class) each request's three positions per token.
        self.encoder_cache: EncoderCache | None = None
        self.rope_positions: RequestRopePositions | None = None
        self.rope_angles: RopeAngles | None = None
        # A prefix-LM (Gemma 3): an image's tokens attend to the whole image (spans no
        # longer than the model's sliding window, when it has one).
        self.bidirectional_images = False
        self._image_span_limit: int | None = None

    # -- setup -------------------------------------------------------------

    def load_model(self) -> None:
        dtype = mlx_dtype_from_torch(self.model_config.dtype)
        lora_config = self.vllm_config.lora_config
        wrap = None
        if lora_config is not None:
            max_positions = getattr(self.model_config.hf_config, "max_position_embeddings", None)

            name = str(lora_config.lora_dtype).removeprefix("torch.")  # LORA_DTYPES
            adapters = dtype if name == "auto" else getattr(mx, name)

            def wrap(model):
                self.lora = LoRAManager(model, lora_config, adapters, max_positions)
        self.loaded = load_model(self.model_config.model, dtype, self.backend, wrap,
                                 self._pipeline_stage(), self._tensor_shard(),
                                 pooling=self.model_config.runner_type == "pooling")
        self._check_quantized_kv()
        mm = self.model_config.multimodal_config
        if mm is not None and not mm.language_model_only:
            tower = load_vision_tower(self.model_config.model, dtype, self.backend)
            if tower is not None:
                self.encoder_cache = EncoderCache(tower)
                if tower.deepstack_levels:
                    use_deepstack(self.loaded.adapter.backbone.layers, tower.deepstack_levels)
                    self.loaded.backbone.modules_only("the image rows' deepstack levels join "
                                                      "the first layers' outputs")
                self.bidirectional_images = self.model_config.is_mm_prefix_lm
                self._image_span_limit = self.model_config.get_sliding_window()
        sections = mrope_sections(self.model_config.hf_config)
        if sections is not None:
            self.rope_angles = use_sectioned_rope(self.loaded.model, *sections)
            self.rope_positions = RequestRopePositions(self.model_config)
        if self.vllm_config.speculative_config is not None:
            self._check_speculative_target()
            self.drafter = make_drafter(self.vllm_config, self.backend, dtype,
                                        self.loaded.dims.vocab_size)
        self._fit_states_in_blocks()
        vocab = self.loaded.dims.vocab_size
        kernels = self.backend.sampling_kernels
        self.sampler = Sampler(vocab, self.logprobs_mode, cpu_kernel=kernels)
        self.prompt_logprobs = PromptLogprobsTracker(vocab, self.logprobs_mode, cpu_kernel=kernels)
        if self.model_config.runner_type == "pooling":
            classifier = None
            if self.model_config.convert_type == "classify":
                from vllm_metal.v1.classifier import make_classifier

                classifier = make_classifier(self.model_config, self.loaded)
            self.pooling = Pooling(self.vllm_config, classifier)

    def _pipeline_stage(self) -> tuple[int, int, StageLink] | None:
        """(stage, stages, link) under --pipeline-parallel-size, else None."""
        if self.vllm_config.parallel_config.pipeline_parallel_size == 1:
            return None
        from vllm.distributed import get_pp_group

        pp = get_pp_group()
        self.link = StageLink(self.mlx_group, None if pp.is_first_rank else pp.prev_rank,
                              None if pp.is_last_rank else pp.next_rank)
        return pp.rank_in_group, pp.world_size, self.link

    def _tensor_shard(self) -> TensorShard | None:
        """This rank's place under --tensor-parallel-size, else None. Tensor parallel
        runs alone (config_checks), so its group is the engine's whole MLX group."""
        if self.vllm_config.parallel_config.tensor_parallel_size == 1:
            return None
        from vllm.distributed import get_tp_group

        tp = get_tp_group()
        gather = envs.VLLM_METAL_TP_GATHER
        if gather is None:
            # The CPU kernels compute a row, head or column alike whatever lies beside
            # it, so gathering there gives one rank's tokens; Metal keeps the memory.
            gather = self.backend.device == mx.cpu
        return TensorShard(tp.rank_in_group, tp.world_size, self.mlx_group, gather)

    def _check_speculative_target(self) -> None:
        recurrent = [i for i, e in enumerate(self.loaded.adapter.entries) if e.state is not None]
        if recurrent:
            # A verification step runs the recurrence through drafts that may be
            # refused, and nothing here keeps the state from before them.
            raise ValueError(
                f"--speculative-config: {self.model_config.architecture} has recurrent "
                f"layers ({len(recurrent)} of {len(self.loaded.adapter.entries)}), whose "
                "state cannot be rolled back past refused drafts; serve it without "
                "--speculative-config")

    def _check_quantized_kv(self) -> None:
        """A quantized --kv-cache-dtype needs plain K/V entries: refused by name otherwise."""
        if self.kv_quant is None:
            return
        flag = f"--kv-cache-dtype {self.vllm_config.cache_config.cache_dtype}"
        entries = self.loaded.adapter.entries
        arch = self.model_config.architecture
        if self.loaded.dims.latent:
            raise ValueError(f"{flag}: {arch} uses multi-head latent attention, whose latent "
                             "cache is not quantized here; use --kv-cache-dtype auto")
        states = self._state_layers()
        if states:
            raise ValueError(f"{flag}: {arch} keeps recurrent state in {states} of "
                             f"{len(entries)} layers, which share the attention pages; "
                             "use --kv-cache-dtype auto")
        if self.vllm_config.speculative_config is not None:
            method = self.vllm_config.speculative_config.method
            if method not in CACHELESS_METHODS:
                raise ValueError(f"{flag}: the {method} drafter keeps a float cache of its own; "
                                 "use --kv-cache-dtype auto or ngram speculation")
        if self.kv_quant.packed:
            head_dim = self.loaded.dims.head_dim
            if head_dim not in PACKED_HEAD_SIZES:
                raise ValueError(f"{flag}: {arch} has head size {head_dim}; caches of 4-bit rows "
                                 f"take {', '.join(map(str, PACKED_HEAD_SIZES))}; use fp8 or "
                                 "int8_per_token_head")
        self._check_skip_layers(flag)

    def _check_skip_layers(self, flag: str) -> None:
        """Every attention layer's cache is quantized alike here. vLLM adds the first
        and last layers of a turboquant run to --kv-cache-dtype-skip-layers itself
        (kept in float on its own kernels): those go on coded, with a warning; any
        other layer asked for is refused."""
        cache = self.vllm_config.cache_config
        skip = {str(x) for x in cache.kv_cache_dtype_skip_layers or ()}
        if not skip:
            return
        boundary: set[str] = set()
        if cache.cache_dtype.startswith("turboquant_"):
            from vllm.model_executor.layers.quantization.turboquant.config import (
                TurboQuantConfig)

            boundary = {str(x) for x in TurboQuantConfig.get_boundary_skip_layers(
                self.model_config)}
        asked = sorted(skip - boundary)
        if asked:
            raise ValueError(f"--kv-cache-dtype-skip-layers {' '.join(asked)}: vllm-metal "
                             f"codes every attention layer's cache as {flag} says; drop the "
                             "flag, or use --kv-cache-dtype auto")
        logger.warning("%s: vLLM keeps layers %s in float; vllm-metal codes them too (the "
                       "accuracy cost of both is measured in docs/kv-cache.md)", flag,
                       ", ".join(sorted(skip, key=lambda x: (len(x), x))))

    @property
    def kv_quant(self) -> KvQuant | None:
        """The quantized format --kv-cache-dtype names (fp8, fp8_e4m3, fp8_e5m2,
        fp8_per_token_head, int8_per_token_head), else None."""
        return from_cache_dtype(self.vllm_config.cache_config.cache_dtype)

    @property
    def kv_dtype(self) -> mx.Dtype:
        """--kv-cache-dtype float16/bfloat16 (vLLM lets it only equal the model's
        dtype); else the backend's choice (the CPU backend stores float16 beside
        int8 activations, or what VLLM_METAL_CPU_KV_CACHE_DTYPE names); else the
        model's dtype."""
        if self.kv_quant is not None:
            return STORAGE_DTYPE
        chosen = _KV_CACHE_DTYPES.get(self.vllm_config.cache_config.cache_dtype)
        if chosen is None:
            chosen = self.backend.kv_cache_dtype(self.loaded.model)
        return chosen if chosen is not None else self.loaded.dtype

    def _fit_states_in_blocks(self) -> None:
        """A hybrid's states live in the K/V blocks of the attention layers they share
        memory with (state_pages.py): grow the block size until every state fits, as
        vLLM aligns hybrid block sizes (over --block-size if need be)."""
        self._states = {i: e.state for i, e in enumerate(self.loaded.adapter.entries)
                        if e.state is not None}
        states = list(self._states.values())
        if not states:
            return
        dims = self.loaded.dims
        cache = self.vllm_config.cache_config
        size = self.block_size
        if not all(s.fits(half_page_floats(size, dims.num_kv_heads, dims.head_dim,
                                           self.kv_dtype.size)) for s in states):
            size = block_size_for_states(states, dims.num_kv_heads, dims.head_dim,
                                         self.kv_dtype.size, max(KERNEL_BLOCK_SIZES))
            logger.info("KV cache block size %d -> %d tokens: a block holds one request's "
                        "recurrent state (%.2f MiB)", self.block_size, size,
                        max(s.nbytes for s in states) / 2**20)
        cache.block_size = size
        cache.mamba_page_size_padded = PagedKVCache.bytes_per_block(
            1, size, dims.num_kv_heads, dims.head_dim, self.kv_dtype)
        if cache.mamba_cache_mode == "align":
            cache.mamba_block_size = size
        self.block_size = size
        self.input_batch.set_block_size(size)

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        """One spec per KV entry: sliding-window layers as vLLM's sliding-window
        kind, so its hybrid manager frees the blocks that left their window;
        latent (MLA) layers as vLLM's MLA kind, one row per token, no values; a
        hybrid's linear-attention layers as vLLM's mamba kind, one state per request
        (two in align mode) in a block padded to the attention page."""
        dims = self.loaded.dims
        common = dict(block_size=self.block_size, num_kv_heads=dims.num_kv_heads,
                      head_size=dims.head_dim, dtype=torch_dtype_from_mlx(self.kv_dtype))
        if self.kv_quant is not None:
            # Each row carries its scale: the page is larger than vLLM's
            # head_size bytes per element would make it.
            common["page_size_padded"] = PagedKVCache.bytes_per_block(
                1, self.block_size, dims.num_kv_heads, dims.head_dim, self.kv_dtype,
                quant=self.kv_quant)
            if self.kv_quant.packed:
                # Fewer bytes than head_size uint8 elements: the packed K and V
                # rows' size is the cell vLLM counts.
                common["state_content_bytes"] = (self.kv_quant.key_width(dims.head_dim)
                                                 + self.kv_quant.value_width(dims.head_dim))
        cache = self.vllm_config.cache_config
        specs: dict[str, KVCacheSpec] = {}
        adapter = self.loaded.adapter
        for i, entry in enumerate(adapter.entries):
            name = _entry_name(adapter.held[i])
            if entry.state is not None:
                st = entry.state
                shapes = [(st.conv_kernel - 1, st.conv_dim)]
                if st.num_v_heads:
                    shapes.append((st.num_v_heads, st.head_v_dim, st.head_k_dim))
                specs[name] = MambaSpec(
                    shapes=tuple(shapes), dtypes=(torch.float32,) * len(shapes),
                    block_size=cache.mamba_block_size,
                    page_size_padded=cache.mamba_page_size_padded,
                    mamba_type=_mamba_type(st),
                    mamba_cache_mode=cache.mamba_cache_mode)
            elif entry.latent_rank is not None:
                specs[name] = MLAAttentionSpec(**common)
            elif entry.window is None:
                specs[name] = FullAttentionSpec(**common)
            else:
                specs[name] = SlidingWindowSpec(**common, sliding_window=entry.window)
        return specs

    def kv_bytes_per_block(self) -> int:
        """Bytes a block id holds: the target's entries, and a draft model's."""
        draft = self.drafter.bytes_per_block(self.block_size, self.kv_dtype) if self.drafter else 0
        return self._target_bytes_per_block() + draft

    def target_kv_fraction(self) -> float:
        """The target's share of kv_bytes_per_block (what vLLM's plan sizes)."""
        return self._target_bytes_per_block() / self.kv_bytes_per_block()

    def draft_parameter_bytes(self) -> int:
        return self.drafter.parameter_bytes() if self.drafter is not None else 0

    def _target_bytes_per_block(self) -> int:
        dims = self.loaded.dims
        return PagedKVCache.bytes_per_block(dims.num_layers, self.block_size,
                                            dims.num_kv_heads, dims.head_dim, self.kv_dtype,
                                            latent=dims.latent, quant=self.kv_quant)

    def kv_bytes_per_request(self) -> int:
        """Bytes one max_model_len request holds: a block per block_size tokens in every
        attention entry, and in every recurrent-state entry one block (two in align
        mode, the state that moves on and the one it left)."""
        entries = self.loaded.adapter.entries
        page = self._target_bytes_per_block() // len(entries)
        states = sum(e.state is not None for e in entries)
        kept = 2 if self.vllm_config.cache_config.mamba_cache_mode == "align" else 1
        blocks = -(-self.max_model_len // self.block_size)
        draft = self.kv_bytes_per_block() - self._target_bytes_per_block()
        return page * ((len(entries) - states) * blocks + states * kept) + draft * blocks

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        dims = self.loaded.dims
        groups, tensor_of = _layout(kv_cache_config,
                                    [_entry_name(i) for i in self.loaded.adapter.held])
        self.kv_cache = PagedKVCache(dims.num_layers, kv_cache_config.num_blocks, self.block_size,
                                     dims.num_kv_heads, dims.head_dim, self.kv_dtype,
                                     tensor_of=tensor_of, groups=groups, latent=dims.latent,
                                     quant=self.kv_quant, key_columns=self.backend.key_columns)
        self.input_batch.set_num_groups(len(kv_cache_config.kv_cache_groups))
        self._state_groups = {g: group.kv_cache_spec.block_size
                              for g, group in enumerate(kv_cache_config.kv_cache_groups)
                              if isinstance(group.kv_cache_spec, MambaSpec)}
        huge = self.backend.commit_kv_cache(self.kv_cache)
        if self.drafter is not None and self.drafter.bytes_per_block(self.block_size,
                                                                     self.kv_dtype):
            draft = self.drafter.initialize_cache(kv_cache_config.num_blocks, self.block_size,
                                                  self.kv_dtype, _full_group(kv_cache_config))
            huge += self.backend.commit_kv_cache(draft)
        logger.info("KV cache: %d blocks of %d tokens, %s, %.1f MiB, %d group(s), committed%s",
                    kv_cache_config.num_blocks, self.block_size,
                    (self.kv_quant.description if self.kv_quant
                     else str(self.kv_dtype).removeprefix("mlx.core.")
                     + (" (keys as columns)" if self.kv_cache.key_columns else "")),
                    self.kv_cache.nbytes / 2**20,
                    len(kv_cache_config.kv_cache_groups),
                    f" ({huge / 2**20:.0f} MiB on huge pages)" if huge else "")
        transfer = self.vllm_config.kv_transfer_config
        if transfer is not None and transfer.kv_connector is not None:
            self._check_offloading()
        self.connector = ConnectorLink.attach(self.vllm_config, kv_cache_config,
                                              self._pool_views, mx.synchronize)

    def _pool_views(self) -> list[np.ndarray]:
        """uint8 [num_blocks, row_bytes] over each KV buffer (the offload copies' view)."""
        return [np.frombuffer(memoryview(b), dtype=np.uint8).reshape(b.shape[0], -1)
                for b in self.kv_cache.buffers()]

    def _state_layers(self) -> int:
        """How many layers keep a recurrent state in their K/V pages (a hybrid's)."""
        return sum(e.state is not None for e in self.loaded.adapter.entries)

    def _check_offloading(self) -> None:
        """KV offloading moves whole K/V pages: a recurrent state sharing them is refused."""
        states = self._state_layers()
        if states:
            raise ValueError(f"KV offloading: {self.model_config.architecture} keeps recurrent "
                             f"state in {states} layers' pages, which offloading does not "
                             "carry; drop --kv-offloading-size / --kv-transfer-config")

    def profile_run(self) -> ActivationEstimate:
        """Estimate the peak activation bytes of a max_num_batched_tokens forward.

        Runs a forward of PROFILE_TOKENS fresh prompt tokens and scales its peak
        linearly: the paged kernels materialize no [q, k] score matrix, so every
        activation is proportional to the token count. A full-size forward would
        cost minutes at startup on slow backends for no better answer. MLX's peak
        and the CPU kernels' own scratch (which MLX does not see) are kept apart.
        """
        target = min(self.max_num_batched_tokens, self.max_num_reqs * self.max_model_len)
        num_tokens = min(target, PROFILE_TOKENS, self.max_model_len)
        blocks = -(-num_tokens // self.block_size)
        dims = self.loaded.dims
        cache = PagedKVCache(dims.num_layers, blocks + 1, self.block_size,
                             dims.num_kv_heads, dims.head_dim, self.kv_dtype, latent=dims.latent,
                             quant=self.kv_quant, key_columns=self.backend.key_columns)
        step = _synthetic_prefill(np.array([num_tokens], dtype=np.int32), blocks, self.block_size)
        arrays, scratch = self.forward_peak(step, cache)
        del cache
        mx.clear_cache()
        scale = target / num_tokens
        return ActivationEstimate(int(arrays * scale * ARRAYS_MARGIN), int(scratch * scale))

    def forward_peak(self, step: StepInputs, cache: PagedKVCache) -> tuple[int, int]:
        """Run ``step`` through the model and its head and return (MLX's peak bytes above
        its live level, the CPU kernels' scratch peak). The scratch is counted whole, not
        its growth: buffers the kernels keep count as much as new ones."""
        ops = get_ops()
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        ops.scratch_bytes(reset=True)
        # A profiling cache has one group: its requests' states sit in their first block.
        slots = (self._state_blocks(step, {0: self.max_model_len}) if self._states else None)
        hidden = self._forward(step, cache, state_slots=slots)
        mx.eval(self.loaded.logits(hidden[mx.array(step.logits_indices)]))
        return max(mx.get_peak_memory() - before, 0), ops.scratch_bytes()[1]

    # -- the step ----------------------------------------------------------

    def execute_model(self, scheduler_output: SchedulerOutput, intermediate_tensors=None):
        with self.pending_tokens.lock:   # see PendingTokens.lock
            return self._execute_model(scheduler_output)

    def _execute_model(self, scheduler_output: SchedulerOutput):
        self._update_states(scheduler_output)
        if self.connector is not None:
            self.connector.begin(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens == 0:
            if self.connector is not None:
                return ModelRunnerOutput.with_kv_conn_output_only(
                    self.connector.end(scheduler_output))
            return EMPTY_MODEL_RUNNER_OUTPUT
        self.pending_tokens.resolve_stale()
        self._step_drafts = scheduler_output.scheduled_spec_decode_tokens
        step = self.input_batch.prepare_inputs(scheduler_output)
        if self.rope_positions is not None:
            step.mrope = self.rope_positions.of_step(step)
            step.rope_angles = self.rope_angles.table(step.mrope)
        if self.bidirectional_images:
            step.key_ends = self.encoder_cache.key_ends(step, self._image_span_limit)
        if self.lora is not None:
            states = [self.input_batch.requests[r] for r in step.req_ids]
            per_request = np.array([s.lora_id for s in states], dtype=np.int64)
            self.lora.prepare_step(np.repeat(per_request, np.diff(step.cu_seqlens_q)),
                                   {s.lora_id: s.lora_request for s in states if s.lora_id})
        slots = self._carry_states(step)
        link = self.link
        if link is not None and link.prev is not None:
            link.receive(len(step.input_ids), self.loaded.adapter.hidden_size)
        merged = None if self.encoder_cache is None else self.encoder_cache.gather(step)
        hidden = self._forward(step, self.kv_cache, self.pending_tokens.fill_inputs(step), slots,
                               merged)
        if link is not None:
            if link.next is not None:
                link.send()   # the last stage computes the logits and samples
                return None
            link.clear()
        if self.pooling is not None:
            kv_output = None if self.connector is None else self.connector.end(scheduler_output)
            return self._pooled_output(step, hidden, kv_output)
        logits = rows = None
        if not len(step.logits_indices):
            # Nothing to sample (prompt chunks only): run the step anyway. The decoder
            # stack writes the KV cache as a side effect of its output, which nothing
            # else would ever evaluate.
            mx.async_eval(hidden)
        else:
            # The indices rise strictly within [0, total_q): as many as the rows (a
            # decode step) means every row, in order, and no gather node is needed.
            rows = hidden
            if len(step.logits_indices) != hidden.shape[0]:
                rows = hidden[mx.array(step.logits_indices)]
            logits = self.loaded.logits(rows)
        prompt_lps = {}
        if self.prompt_logprobs.active:
            prompt_lps = self.prompt_logprobs.collect(
                step, self.input_batch.requests, hidden, self.loaded.logits)
        kv_output = None if self.connector is None else self.connector.end(scheduler_output)
        self._forwarded = _ForwardedStep(step, logits, prompt_lps, rows, kv_output)
        if logits is not None and getattr(scheduler_output, "pending_structured_output_tokens",
                                          False):
            # vLLM defers the sampling of a step with grammar tokens in flight until it
            # has advanced the grammars: start the forward now, or the device idles
            # through that host work. Up to the head's input when the step will likely
            # take the head's own masked argmax (which would compute the head again),
            # else through the logits the sampler reads.
            states = [self.input_batch.requests[r] for r in step.sampling_req_ids]
            plain = all(_greedy_plain(s.sampling_params) for s in states)
            mx.async_eval(rows if plain else logits)
        return None

    def _pooled_output(self, step: StepInputs, hidden: mx.array,
                       kv_output: KVConnectorOutput | None) -> ModelRunnerOutput:
        """A pooling step's output: each request's pooled prompt once its last chunk
        ran (None before), and no tokens."""
        output = ModelRunnerOutput(req_ids=step.req_ids,
                                   req_id_to_index={r: i for i, r in enumerate(step.req_ids)},
                                   kv_connector_output=kv_output)
        output.pooler_output = self.pooling.pool(step.req_ids, step.cu_seqlens_q, step.seq_lens,
                                                 hidden)
        return output

    def sample_tokens(self, grammar_output: GrammarOutput | None):
        """Sample this step's tokens. With the decode pipeline on, returns at once and the
        host waits only in ``get_output()``; the next forward reads the ids on the device."""
        with self.pending_tokens.lock:   # see PendingTokens.lock
            return self._sample_tokens(grammar_output)

    def _sample_tokens(self, grammar_output: GrammarOutput | None):
        forwarded, self._forwarded = self._forwarded, None
        if forwarded is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        step = forwarded.step
        sampling_ids = step.sampling_req_ids
        if self.drafter is not None:
            self._proposal_ids = sampling_ids
        if step.num_drafts is not None:
            return self._sample_with_drafts(forwarded, grammar_output)
        inflight = logprobs = None
        if sampling_ids:
            states = [self.input_batch.requests[r] for r in sampling_ids]
            if any(_reads_output_values(s.sampling_params) for s in states):
                self.pending_tokens.resolve_all()  # penalties / bad words read real ids
            batch = self._sampling_batches.get([s.sampling for s in states],
                                               self.loaded.dims.vocab_size)
            bitmask = _align_bitmask(grammar_output, sampling_ids)
            greedy = None
            if batch.all_greedy_plain:
                # The head's own argmax (of the tokens the grammars admit): the logits
                # node is then never evaluated.
                allowed = None if bitmask is None else grammar_bitmask_words(bitmask)
                if allowed is None or allowed.shape[1] * 32 >= self.sampler.vocab_size:
                    greedy = self.loaded.greedy_tokens(forwarded.rows, self.sampler.vocab_size,
                                                       allowed)
            if greedy is not None:
                result = SamplerResult(greedy, None)
            else:
                result = self.sampler(forwarded.logits, batch, bitmask)
            inflight = self.pending_tokens.add(result.sampled, sampling_ids)
            logprobs = result.logprobs
            arrays = [result.sampled, *(logprobs or ())]
            if self._pipeline:
                mx.async_eval(*arrays)
            else:
                mx.eval(*arrays)
        output = _StepOutput(self.pending_tokens, step, inflight, logprobs,
                             forwarded.prompt_logprobs, forwarded.kv_output)
        return output if self._pipeline else output.get_output()

    def _sample_with_drafts(self, forwarded: _ForwardedStep,
                            grammar_output: GrammarOutput | None) -> ModelRunnerOutput:
        """A step whose queries end in drafts: each sampling request emits its accepted
        drafts and one more token (rejection.py), read back before returning."""
        step = forwarded.step
        sampling_ids = step.sampling_req_ids
        self.pending_tokens.resolve_all()
        states = [self.input_batch.requests[r] for r in sampling_ids]
        drafts = [list(self._step_drafts.get(r, ())) for r in sampling_ids]
        verified = verify_drafts(self.sampler, self.loaded, states, drafts, forwarded.rows,
                                 forwarded.logits, grammar_output)
        emitted = dict(zip(sampling_ids, verified.tokens))
        for req_id, tokens in emitted.items():
            for token in tokens:
                self.input_batch.append_token(req_id, token)
        counts = [len(emitted.get(r, ())) for r in step.req_ids]
        logprobs = None
        if verified.logprobs is not None:
            logprobs = LogprobsLists(*verified.logprobs,
                                     cu_num_generated_tokens=np.cumsum([0, *counts]).tolist())
        return _runner_output(step, emitted, logprobs, forwarded.prompt_logprobs,
                              forwarded.kv_output)

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """Drafts for the requests that sampled in the last step (vLLM calls this after
        it has taken that step's output)."""
        if self.drafter is None or not self._proposal_ids:
            return None
        with self.pending_tokens.lock:
            return self._take_draft_token_ids()

    def _take_draft_token_ids(self) -> DraftTokenIds:
        self.pending_tokens.resolve_all()
        req_ids = [r for r in self._proposal_ids if r in self.input_batch.requests]
        self._proposal_ids = []
        return DraftTokenIds(req_ids, self.drafter.propose(self.input_batch, req_ids))

    # -- helpers -----------------------------------------------------------

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        cached = scheduler_output.scheduled_cached_reqs
        for req_id in (*scheduler_output.finished_req_ids, *cached.resumed_req_ids,
                       *(scheduler_output.preempted_req_ids or ())):
            self.pending_tokens.forget(req_id)
            if self.drafter is not None:
                self.drafter.forget(req_id)
        # A stage before the last samples nothing: vLLM sends it the sampled tokens.
        apply_scheduler_output(self.input_batch, scheduler_output, self.prompt_logprobs,
                               takes_sampled=self.link is not None and self.link.next is not None)
        if self.pooling is not None:
            self._update_pooling(scheduler_output)
        if self.encoder_cache is not None:
            self.encoder_cache.update(scheduler_output)
        if self.rope_positions is not None:
            for req_id in scheduler_output.finished_req_ids:
                self.rope_positions.remove(req_id)
            for new in scheduler_output.scheduled_new_reqs:
                self.rope_positions.add(new.req_id, new.prompt_token_ids, new.mm_features)
        if scheduler_output.total_num_scheduled_tokens == 0:
            return
        copies = getattr(scheduler_output, "kv_cache_block_copies", None)
        if copies:
            self.kv_cache.copy_blocks([c.src_block_id for c in copies],
                                      [c.dst_block_id for c in copies])
        zero = getattr(scheduler_output, "new_block_ids_to_zero", None)
        if zero:
            self.kv_cache.zero_blocks(zero)

    def _update_pooling(self, scheduler_output: SchedulerOutput) -> None:
        """Pooling inputs follow the requests; a preempted request's chunks are
        recomputed from its start, so what its earlier chunks left is dropped."""
        pooling = self.pooling
        for req_id in scheduler_output.finished_req_ids:
            pooling.remove_request(req_id)
        for req_id in scheduler_output.preempted_req_ids or ():
            pooling.restart(req_id)
        for new in scheduler_output.scheduled_new_reqs:
            if new.pooling_params is None:
                raise ValueError(f"request {new.req_id}: a pooling engine serves pooling "
                                 "requests only (it has no sampling)")
            pooling.add_request(new.req_id, new.pooling_params, list(new.prompt_token_ids))

    @staticmethod
    def _state_blocks(step: StepInputs, state_groups: dict[int, int]
                      ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per state group, (block its state was left in, block this step runs it in)
        of each request (block ids; -1: no state yet). A state group keeps a request's
        running state in the block of its last scheduled token, so a block that fills
        keeps the state at its end for prefix caching (vLLM's align mode); with one
        block per request (mamba block size max_model_len) both are that block."""
        first = step.cu_seqlens_q[:-1]
        computed = step.positions[first].astype(np.int64)
        last = step.seq_lens.astype(np.int64) - 1
        out = {}
        for g, size in state_groups.items():
            table = step.block_tables[g]
            rows = np.arange(table.shape[0])
            prev = np.where(computed > 0, table[rows, np.maximum(computed - 1, 0) // size], -1)
            out[g] = prev.astype(np.int32), table[rows, last // size].astype(np.int32)
        return out

    def _carry_states(self, step: StepInputs) -> dict | None:
        """Copy each state that moves to a new block this step (align mode, or a prefix
        hit: the cached block's state starts the request's running block); returns
        _state_blocks for the forward, None for a model without state entries."""
        if not self._state_groups:
            return None
        blocks = self._state_blocks(step, self._state_groups)
        src, dst = [], []
        for prev, cur in blocks.values():
            moved = (prev >= 0) & (prev != cur)
            src += prev[moved].tolist()
            dst += cur[moved].tolist()
        self.kv_cache.copy_blocks(src, dst)
        return blocks

    def _forward(self, step: StepInputs, cache: PagedKVCache,
                 input_ids: mx.array | None = None, state_slots: dict | None = None,
                 merged: tuple[np.ndarray, mx.array] | None = None) -> mx.array:
        """Packed forward over all scheduled tokens -> hidden [total_q, hidden] (lazy).
        state_slots: _state_blocks of the step (hybrids only); merged: the step's
        encoder outputs (EncoderCache.gather)."""
        hidden = packed_forward(self.loaded, step, cache, self._states, input_ids, state_slots,
                                merged)
        if self._debug_sync:
            mx.eval(hidden)  # surfaces kernel errors at the forward that caused them
        return hidden


class _StepOutput(AsyncModelRunnerOutput):
    """One step's ModelRunnerOutput; reading it back waits for the device."""

    def __init__(self, pending: PendingTokens, step: StepInputs, inflight: InflightStep | None,
                 logprobs, prompt_logprobs: dict, kv_output: KVConnectorOutput | None) -> None:
        self._pending_tokens = pending
        self._kv_output = kv_output
        self._step = step
        self._inflight = inflight
        self._logprobs = logprobs
        self._prompt_logprobs = prompt_logprobs

    def get_output(self) -> ModelRunnerOutput:
        step = self._step
        sampled: dict[str, list[int]] = {}
        logprobs = None
        if self._inflight is not None:
            tokens = self._pending_tokens.resolve(self._inflight)
            sampled = {r: [int(t)] for r, t in zip(self._inflight.req_ids, tokens.tolist())}
            if self._logprobs is not None:
                ids, lps, ranks = (np.array(a) for a in self._logprobs)
                logprobs = _expand_logprobs(LogprobsLists(ids, lps, ranks), step)
        return _runner_output(step, sampled, logprobs, self._prompt_logprobs, self._kv_output)

    def get_kv_connector_output(self) -> KVConnectorOutput | None:
        return self._kv_output


def _runner_output(step: StepInputs, sampled: dict[str, list[int]],
                   logprobs: LogprobsLists | None, prompt_logprobs: dict,
                   kv_output: KVConnectorOutput | None = None) -> ModelRunnerOutput:
    """vLLM's output of a step: each scheduled request's sampled tokens ([] for prompt
    chunks), in the step's order."""
    return ModelRunnerOutput(
        req_ids=step.req_ids,
        req_id_to_index={r: i for i, r in enumerate(step.req_ids)},
        sampled_token_ids=[sampled.get(r, []) for r in step.req_ids],
        logprobs=logprobs,
        prompt_logprobs_dict=prompt_logprobs,
        kv_connector_output=kv_output,
    )


def _greedy_plain(params) -> bool:
    """Whether a request with these sampling params is likely all_greedy_plain (a hint:
    nothing depends on it but what a step starts early)."""
    return bool(params.temperature < SAMPLING_EPS and params.logprobs is None
                and not params.logit_bias and not params.allowed_token_ids
                and not params.min_tokens and not _reads_output_values(params))


def _reads_output_values(params) -> bool:
    """Whether sampling this request reads the values (not just the count) of its outputs."""
    return bool(params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
                or params.frequency_penalty != 0.0 or params.bad_words_token_ids)


def _synthetic_prefill(q_lens: np.ndarray, blocks_per_seq: int, block_size: int) -> StepInputs:
    """Inputs for a forward of fresh prompts of ``q_lens`` tokens (profiling/warm-up)."""
    num_seqs = len(q_lens)
    block_tables = (1 + np.arange(num_seqs * blocks_per_seq, dtype=np.int32)).reshape(
        num_seqs, blocks_per_seq)
    return StepInputs.of_spans([f"profile-{i}" for i in range(num_seqs)],
                               np.zeros(int(q_lens.sum()), np.int32),
                               np.zeros(num_seqs, np.int32), q_lens.astype(np.int32),
                               block_tables, block_size)


def _entry_name(entry: int) -> str:
    return f"model.layers.{entry}.self_attn"


def _layout(config: KVCacheConfig, names: list[str]) -> tuple[list[int], list[int]]:
    """(KV cache group of each entry, buffer of each entry) as vLLM planned them.

    vLLM places layer ``l`` of a KVCacheTensor at byte ``offset + l * layer_stride``
    of one backing allocation, and groups overlay each other from byte 0: layers
    of different groups that start at the same byte share a buffer. ``names``: each
    entry's layer name (a pipeline stage's entries are some of the model's).
    """
    num_entries = len(names)
    index = {name: i for i, name in enumerate(names)}
    groups: list[int | None] = [None] * num_entries
    starts: list[int | None] = [None] * num_entries
    for g, group in enumerate(config.kv_cache_groups):
        for name in group.layer_names:
            groups[index[name]] = g
    for tensor in config.kv_cache_tensors:
        for l, name in enumerate(tensor.layers):
            starts[index[name]] = tensor.offset + l * tensor.layer_stride
    if None in groups or None in starts:
        missing = [names[i] for i in range(num_entries)
                   if groups[i] is None or starts[i] is None]
        raise ValueError(f"vLLM's KV cache plan leaves out {', '.join(missing)}")
    buffer_of = {start: b for b, start in enumerate(sorted(set(starts)))}
    return groups, [buffer_of[start] for start in starts]


def _full_group(config: KVCacheConfig) -> int:
    """The KV cache group whose block tables keep every block of a request (a draft
    model's cache follows them)."""
    for g, group in enumerate(config.kv_cache_groups):
        spec = group.kv_cache_spec
        if isinstance(spec, FullAttentionSpec):   # MLA's included
            return g
    raise ValueError("--speculative-config: a draft model needs a target with full-attention "
                     "layers (this one has only sliding-window or recurrent ones)")


def _align_bitmask(grammar_output: GrammarOutput | None, sampling_ids: list[str]):
    """Reorder vLLM's grammar bitmask rows to the sampling rows; all-ones elsewhere."""
    if grammar_output is None or not grammar_output.structured_output_request_ids:
        return None
    source = np.asarray(grammar_output.grammar_bitmask, dtype=np.int32)
    ids = grammar_output.structured_output_request_ids
    # With speculative decoding each request owns a block of 1 + k rows (one per
    # draft position); a step without drafts reads each block's first row.
    stride = source.shape[0] // len(ids)
    aligned = np.full((len(sampling_ids), source.shape[1]), -1, dtype=np.int32)
    row_of = {r: i for i, r in enumerate(sampling_ids)}
    for j, req_id in enumerate(ids):
        i = row_of.get(req_id)
        if i is not None:
            aligned[i] = source[j * stride]
    return aligned


def _expand_logprobs(logprobs: LogprobsLists | None, step: StepInputs) -> LogprobsLists | None:
    """Give every scheduled request a logprobs row (vLLM indexes them by request)."""
    if logprobs is None:
        return None
    num_reqs = len(step.req_ids)
    width = logprobs.logprob_token_ids.shape[1]
    ids = np.zeros((num_reqs, width), dtype=np.int32)
    lps = np.full((num_reqs, width), -np.inf, dtype=np.float32)
    ranks = np.zeros(num_reqs, dtype=np.int32)
    rows = np.flatnonzero(step.sample_mask)
    ids[rows], lps[rows], ranks[rows] = (logprobs.logprob_token_ids, logprobs.logprobs,
                                         logprobs.sampled_token_ranks)
    return LogprobsLists(ids, lps, ranks)


def _mamba_type(state: GdnStateShape) -> MambaAttentionBackendEnum:
    """The label vLLM's hybrid manager groups a state layer by (the compute is ours)."""
    if not state.num_v_heads:
        return MambaAttentionBackendEnum.SHORT_CONV
    if state.delta_rule:
        return MambaAttentionBackendEnum.GDN_ATTN
    return MambaAttentionBackendEnum.MAMBA2
