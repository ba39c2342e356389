"""Load an MLX model for vLLM and derive the dimensions the KV cache needs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from vllm_metal.backend import Backbone, Backend
from vllm_metal.distributed.pipeline import PipelineStage, StageLink, cut_layers
from vllm_metal.distributed.tensor import TensorShard, check_probed_heads, shard_layer
from vllm_metal.models.adapter import (ModelAdapter, UnsupportedModelError, backbone_layers,
                                       family_name)
from vllm_metal.v1.classifier import SCORE_PREFIX

logger = logging.getLogger("vllm_metal")


@dataclass(frozen=True)
class ModelDims:
    num_layers: int     # KV entries (layers that share K/V count once)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    # Multi-head latent attention: every entry caches one latent row per token
    # (num_kv_heads 1, head_dim = rank + rope_dim), no separate values.
    latent: bool = False


@dataclass
class LoadedModel:
    model: nn.Module
    adapter: ModelAdapter
    dims: ModelDims
    dtype: mx.Dtype
    # The family's backbone as the backend runs it: input_ids int32 [1, total_q] ->
    # final hidden states [1, total_q, hidden].
    backbone: Backbone

    def logits(self, hidden: mx.array) -> mx.array:
        """hidden [R, hidden] -> logits [R, vocab] (the family's own head)."""
        return self.adapter.logits(hidden)

    def greedy_tokens(self, hidden: mx.array, vocab_size: int,
                      allowed: mx.array | None = None) -> mx.array | None:
        """hidden [R, hidden] -> int32 [R], argmax of ``logits(hidden)[:, :vocab_size]`` in
        one node that never writes the logits out; None where the head has no such op
        (not a CPU quantized head, a head the family transforms after, or activations
        other than float32). allowed: uint32 [R, ceil(vocab_size / 32)], a grammar
        bitmask; the argmax is then over the tokens it admits."""
        if self.adapter.plain_head is None:
            return None
        head, _ = self.adapter.plain_head
        greedy = getattr(head, "greedy", None)
        if greedy is None or hidden.dtype != mx.float32 or vocab_size > head["weight"].shape[0]:
            return None   # the sampler's path (and its errors) apply
        if head.get("bias") is not None and head["bias"].dtype != mx.float32:
            return None
        return greedy(hidden, vocab_size, allowed)


def load_model(model_path: str, dtype: mx.Dtype, backend: Backend,
               wrap: Callable[[nn.Module], None] | None = None,
               pipeline: tuple[int, int, StageLink] | None = None,
               tensor: TensorShard | None = None, pooling: bool = False) -> LoadedModel:
    """Load a local HF-format model directory (float or MLX-quantized) with mlx-lm,
    or a GGUF file, and prepare it for ``backend``.

    Floating parameters (including quantization scales/biases) are cast to ``dtype``.
    ``wrap`` changes the model's modules (LoRA) once its weights are the backend's and
    before the backend plans its backbone, which then sees the modules that run.
    ``pipeline``: (stage rank, stages, link): only that stage's layers are loaded and
    run (vllm_metal.distributed.pipeline). ``tensor``: this rank's share of every
    layer's heads and MLP columns (vllm_metal.distributed.tensor). ``pooling``: the
    engine pools hidden states (--runner pooling), so a checkpoint of the bare decoder
    (embedding models are often saved without the LM head) is loaded too.
    """
    stage = family = None
    heads: list = []

    def cut(model: nn.Module) -> None:   # before any weight is read
        nonlocal stage, family
        family = family_name(model)
        if pipeline is not None:
            rank, size, link = pipeline
            layers = backbone_layers(model)
            stage = PipelineStage.of(len(layers), rank, size)
            cut_layers(layers, stage, link)

    def shard(index: int, layer: nn.Module) -> None:   # before its weights are evaluated
        heads.append(shard_layer(index, layer, tensor, family))

    model = _load_mlx_model(model_path, dtype, cut, shard if tensor is not None else None,
                            pooling)
    backend.prepare_weights(model)
    mx.eval(model.parameters())
    adapter = ModelAdapter(model, stage, tensor)
    if tensor is not None:
        check_probed_heads(adapter.entries, heads, adapter.family)
    dims = derive_dims(adapter)
    if wrap is not None:
        wrap(model)
    backbone = backend.prepare_backbone(model, adapter, dims)
    logger.info("Loaded %s%s%s: %d layers, %d/%d heads, head_dim %d, %s, %.1f MiB; %s",
                adapter.family, "" if stage is None else
                f" (pipeline stage {stage.rank}: layers {stage.start}-{stage.end - 1})",
                "" if tensor is None else f" (tensor rank {tensor.rank} of {tensor.size})",
                dims.num_layers, dims.num_heads,
                dims.num_kv_heads, dims.head_dim, dtype, parameter_bytes(model) / 2**20,
                backbone.summary)
    return LoadedModel(model, adapter, dims, dtype, backbone)


def _load_mlx_model(model_path: str, dtype: mx.Dtype,
                    arrange: Callable[[nn.Module], None] = lambda model: None,
                    settle: Callable[[int, nn.Module], None] | None = None,
                    pooling: bool = False) -> nn.Module:
    """A GGUF file through our GGUF loader; an HF-format directory through mlx-lm (lazily:
    nothing is read until evaluated). ``arrange(model)`` runs before any weight is read,
    ``settle(index, layer)`` on each decoder layer holding parameters before its weights
    are evaluated (load_gguf_model's). ``pooling``: see load_model."""
    from vllm_metal.gguf.loader import gguf_source, layers_with_parameters
    from vllm_metal.gguf_plugin import gguf_model_file

    # A GGUF's derived HF directory stands for the file (a draft model's path).
    gguf = gguf_model_file(model_path) or gguf_source(model_path)
    if gguf is not None:
        from vllm_metal.gguf.loader import load_gguf_model

        return load_gguf_model(gguf, dtype, arrange, settle)[0]
    from mlx_lm.utils import _get_classes
    from mlx_lm.utils import load_model as mlx_lm_load_model

    path = Path(model_path)
    if not path.is_dir():
        raise ValueError(
            f"model path {model_path!r} is neither a local model directory nor a .gguf "
            "file; vllm-metal loads models from disk (download it first, e.g. with "
            "`hf download`)")
    model, _config = mlx_lm_load_model(path, lazy=True, model_config=_config_overrides(path),
                                       get_model_classes=_bare_decoder_classes(_get_classes,
                                                                               pooling))
    arrange(model)
    model.set_dtype(dtype)
    if settle is not None:
        held = layers_with_parameters(model)
        for index, layer in enumerate(backbone_layers(model)):
            if index in held:
                settle(index, layer)
    return model


def _config_overrides(path: Path) -> dict:
    """Config overrides giving a transformers-5 checkpoint's rotary settings in the
    keys mlx-lm's model args read: transformers 5 saves them as ``rope_parameters``
    ({"rope_theta", "rope_type", factor, ...}) with no ``rope_theta`` or
    ``rope_scaling``, and most of mlx-lm's families would then rotate with their
    default base (10000 for Llama), silently. Families that read ``rope_parameters``
    themselves get the same values twice; per-layer-type parameters (Gemma's) are left
    to their family.

    Also the text model's vocabulary size at the top level of a multimodal config
    that has none (transformers 5 keeps it in ``text_config``): mlx-lm's Gemma 3
    wrapper reads the top-level one, defaulting to the published model's 262208. The
    top-level ``tie_word_embeddings`` in a ``text_config`` without one. And Gemma 3's
    layer kinds (_gemma3_pattern)."""
    import json

    config = json.loads((path / "config.json").read_text())

    def legacy(section: dict) -> dict:
        rope = section.get("rope_parameters")
        if not isinstance(rope, dict) or "rope_theta" not in rope:
            return {}
        out = {} if "rope_theta" in section else {"rope_theta": rope["rope_theta"]}
        kind = rope.get("rope_type", "default")
        if kind != "default" and not section.get("rope_scaling"):
            out["rope_scaling"] = {**{k: v for k, v in rope.items() if k != "rope_theta"},
                                   "type": kind}
        return out

    def fixes(section: dict) -> dict:
        return {**legacy(section), **_gemma3_pattern(section)}

    def inherited(section: dict) -> dict:
        # transformers 5 keeps tie_word_embeddings at the top level only; mlx-lm's
        # wrappers that build the text model from text_config (Qwen3-VL's) require it.
        if "tie_word_embeddings" in section or "tie_word_embeddings" not in config:
            return {}
        return {"tie_word_embeddings": config["tie_word_embeddings"]}

    overrides = fixes(config)
    text = config.get("text_config")
    if isinstance(text, dict) and (fixes(text) or inherited(text)):
        overrides["text_config"] = {**text, **fixes(text), **inherited(text)}
    if isinstance(text, dict) and "vocab_size" in text and "vocab_size" not in config:
        overrides["vocab_size"] = text["vocab_size"]
    return overrides


def _gemma3_pattern(section: dict) -> dict:
    """mlx-lm's Gemma 3 makes every ``sliding_window_pattern``-th layer global (default
    6); transformers builds the kinds ``layer_types`` lists, and transformers 5 saves
    only those (and a ``_sliding_window_pattern`` that need not match them). The
    period that gives the listed kinds where the config's differs or is missing; a
    list no period gives is refused (mlx-lm would build other layers than the
    checkpoint's, silently)."""
    types = section.get("layer_types")
    if section.get("model_type") != "gemma3_text" or not isinstance(types, list):
        return {}
    named = section.get("sliding_window_pattern")
    for period in [named or 6, *range(1, len(types) + 2)]:
        if all((kind == "full_attention") == ((i + 1) % period == 0)
               for i, kind in enumerate(types)):
            return {} if period == named else {"sliding_window_pattern": period}
    raise UnsupportedModelError(
        f"Gemma 3 layer_types {types} are not every n-th layer global, the only "
        "arrangement mlx-lm builds")


def _bare_decoder_classes(get_classes: Callable, pooling: bool) -> Callable:
    """mlx-lm's choice of model classes, whose models also take the weights of a bare
    decoder (``layers.*``, ``embed_tokens.*``, ``norm.*`` where mlx-lm's causal LM holds
    ``model.layers.*``: how transformers saves an AutoModel, e.g. embedding models).
    With ``pooling``, a checkpoint without the LM head gets the embedding matrix in its
    place (a pooling engine never reads the head's output; the profiling forward runs
    it for its memory peak only), and a classification checkpoint's score matrix is
    left to the classifier (vllm_metal.v1.classifier reads it)."""
    def classes(config: dict):
        model_class, args_class = get_classes(config)

        def build(args):
            model = model_class(args)
            own = getattr(model, "sanitize", None)

            def sanitize(weights: dict) -> dict:
                if "model" in model and not any(k.startswith("model.") for k in weights):
                    weights = {f"model.{k}": v for k, v in weights.items()}
                if pooling:
                    weights = {k: v for k, v in weights.items()
                               if not k.startswith(SCORE_PREFIX)}
                if own is not None:
                    weights = own(weights)
                if pooling and "lm_head" in model and "lm_head.weight" not in weights:
                    for part in ("weight", "scales", "biases"):
                        if f"model.embed_tokens.{part}" in weights:
                            weights[f"lm_head.{part}"] = weights[f"model.embed_tokens.{part}"]
                return weights

            model.sanitize = sanitize
            return model

        return build, args_class

    return classes


# The page geometry of a model without attention layers: one head of 64 per token
# row (the block size then grows until a block holds a request's state).
_STATE_ROW = 64


def derive_dims(adapter: ModelAdapter) -> ModelDims:
    """The paged cache's dimensions; refused when KV entries differ in shape. A hybrid's
    state entries take their room in the attention entries' pages (state_pages.py)."""
    attending = [e for e in adapter.entries if e.state is None]
    if not attending:
        # A purely recurrent model (Mamba2): the pages hold only states, rows of a
        # nominal single head of _STATE_ROW floats' worth.
        return ModelDims(len(adapter.entries), 1, 1, _STATE_ROW, adapter.vocab_size)
    shapes = {(e.num_kv_heads, e.head_dim, e.latent_rank) for e in attending}
    if len(shapes) != 1:
        raise UnsupportedModelError(
            f"{adapter.family}: its layers differ in (KV heads, head size, latent rank) "
            f"{sorted(shapes, key=str)}; vllm-metal's paged cache needs one shape for all layers")
    (num_kv_heads, head_dim, latent_rank), = shapes
    num_heads = max(e.num_heads for e in attending)
    return ModelDims(len(adapter.entries), num_heads, num_kv_heads, head_dim,
                     adapter.vocab_size, latent=latent_rank is not None)


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.nbytes for _, p in tree_flatten(model.parameters()))
