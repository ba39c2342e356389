"""The classification head of a --convert classify engine (classify, score, rerank).

Two kinds, as vLLM converts them: a checkpoint saved as ``*ForSequenceClassification``
holds its own score matrix (``score.weight`` [num_labels, hidden], maybe
``score.bias``), which the loader leaves out of the MLX model and which is read here;
an LLM used as a reranker (Qwen3-Reranker, mxbai-rerank, bge-reranker-v2-gemma) names
tokens in ``classifier_from_token`` and a ``method``, and its scores are those
tokens' logits through the model's own LM head.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import torch

from vllm_metal.pytorch_backend.tensor_bridge import mlx_to_torch, torch_to_mlx

if TYPE_CHECKING:
    from vllm.config import ModelConfig

    from vllm_metal.v1.model_lifecycle import LoadedModel

# vLLM's conversions of an LM head into a classifier (its SEQ_CLS_LOAD_METHODS).
FROM_TOKEN_METHODS = ("from_2_way_softmax", "no_post_processing")
SCORE_PREFIX = "score."


def make_classifier(model_config: ModelConfig, loaded: LoadedModel):
    """torch float32 [B, hidden] -> [B, num_labels]: the served model's classifier."""
    text = model_config.hf_config.get_text_config()
    method = getattr(model_config.hf_config, "method", getattr(text, "method", None))
    if method is not None:
        if method not in FROM_TOKEN_METHODS:
            raise ValueError(f"{model_config.architecture}: classifier method {method!r} is "
                             f"not served; vllm-metal serves {', '.join(FROM_TOKEN_METHODS)}")
        tokens = getattr(model_config.hf_config, "classifier_from_token",
                         getattr(text, "classifier_from_token", None))
        return _TokenLogits(loaded, _token_ids(model_config, tokens), method)
    weight, bias = _score_matrix(model_config)
    labels = model_config.hf_config.num_labels
    if weight.shape != (labels, text.hidden_size):
        raise ValueError(f"{model_config.architecture}: score.weight is {tuple(weight.shape)}, "
                         f"expected ({labels}, {text.hidden_size}) from num_labels and "
                         "hidden_size")
    return RowLinear(weight, bias)


class RowLinear:
    """torch [B, in] -> [B, out]: ``x W^T + b`` (then ``activation``), in float64 one
    row at a time: torch's matmul picks its kernel (and summation order) by the
    batch's size, and a request's scores must not depend on what shares its step."""

    def __init__(self, weight, bias=None, activation=None) -> None:
        self.weight = torch.as_tensor(weight).double()
        self.bias = None if bias is None else torch.as_tensor(bias).double()
        self.activation = activation

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.double()
        out = torch.cat([torch.nn.functional.linear(x[i:i + 1], self.weight, self.bias)
                         for i in range(x.shape[0])]) if x.shape[0] else x[:, :0]
        if self.activation is not None:
            out = self.activation(out)
        return out.float()


class _TokenLogits:
    """The named tokens' logits through the LM head: one column per token
    (no_post_processing), or true minus false (from_2_way_softmax: the sigmoid of the
    difference is the two-way softmax's probability of the second token). The same
    rows of the head vLLM copies into its score matrix, applied by the head itself."""

    def __init__(self, loaded: LoadedModel, token_ids: list[int], method: str) -> None:
        if loaded.adapter.plain_head is None:
            # A head that transforms its logits (softcap, scaling) is not the matrix
            # product vLLM takes the rows of.
            raise ValueError(f"{loaded.adapter.family}: its LM head transforms the logits, "
                             "so its rows are not a classifier here; serve it with "
                             "--runner generate")
        self.loaded, self.ids, self.method = loaded, mx.array(token_ids), method
        if method == "from_2_way_softmax" and len(token_ids) != 2:
            raise ValueError(f"from_2_way_softmax needs 2 tokens, got {len(token_ids)}")

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        rows = torch_to_mlx(pooled.float().contiguous(), copy=True).astype(self.loaded.dtype)
        # One row at a time: a head's kernel may sum differently for more rows, and a
        # request's score must not depend on what shares its step.
        logits = mx.concatenate([self.loaded.logits(rows[i:i + 1])[:, self.ids]
                                 for i in range(rows.shape[0])]).astype(mx.float32)
        if self.method == "from_2_way_softmax":
            logits = logits[:, 1:2] - logits[:, 0:1]
        return mlx_to_torch(logits, copy=True)


def _token_ids(model_config: ModelConfig, tokens) -> list[int]:
    from vllm.tokenizers import get_tokenizer

    if not tokens:
        raise ValueError(f"{model_config.architecture}: a classifier method needs "
                         "classifier_from_token")
    tokenizer = get_tokenizer(model_config.tokenizer, revision=model_config.tokenizer_revision,
                              tokenizer_mode=model_config.tokenizer_mode,
                              trust_remote_code=model_config.trust_remote_code)
    ids = [tokenizer.convert_tokens_to_ids(t) for t in tokens]
    unknown = [t for t, i in zip(tokens, ids) if i is None or i == tokenizer.unk_token_id]
    if unknown:
        raise ValueError(f"classifier_from_token: {unknown} are not tokens of the vocabulary")
    return ids


def _score_matrix(model_config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(score.weight float32, score.bias or None) from the checkpoint's safetensors."""
    from safetensors import safe_open

    path = Path(model_config.model)
    files = sorted(path.glob("model*.safetensors")) if path.is_dir() else []
    found: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), "pt") as f:
            for name in (SCORE_PREFIX + "weight", SCORE_PREFIX + "bias"):
                if name in f.keys():
                    found[name] = f.get_tensor(name).float()
    if SCORE_PREFIX + "weight" not in found:
        raise ValueError(f"{model_config.architecture}: no score.weight in {path} (a "
                         "classification checkpoint in safetensors, or an LLM reranker with "
                         "classifier_from_token and method, is served)")
    return found[SCORE_PREFIX + "weight"], found.get(SCORE_PREFIX + "bias")


def encoder_classifier(model_config: ModelConfig, heads: dict):
    """(pooling, classifier) of a BERT-class ``*ForSequenceClassification`` checkpoint
    from its head tensors (``heads``: name -> mx.array, the family prefix removed), as
    vLLM builds them: BERT pools its CLS row through ``pooler.dense`` and tanh, then
    ``classifier``; RoBERTa and XLM-R take the CLS row to ``classifier.dense``, tanh
    and ``classifier.out_proj``. (None, None) for an embedding checkpoint."""
    from vllm.model_executor.layers.pooler.seqwise.heads import EmbeddingPoolerHead
    from vllm.model_executor.layers.pooler.seqwise.methods import get_seq_pooling_method
    from vllm.model_executor.layers.pooler.seqwise.poolers import SequencePooler

    if not any(k.startswith("classifier.") for k in heads):
        return None, None

    def t(name: str) -> torch.Tensor:
        if name not in heads:
            raise ValueError(f"{model_config.architecture}: the checkpoint has no {name}")
        return mlx_to_torch(heads[name].astype(mx.float32), copy=True)

    if "classifier.out_proj.weight" in heads:
        dense = RowLinear(t("classifier.dense.weight"), t("classifier.dense.bias"), torch.tanh)
        out = RowLinear(t("classifier.out_proj.weight"), t("classifier.out_proj.bias"))
        return None, lambda x: out(dense(x))
    method = model_config.pooler_config.seq_pooling_type
    pooling = SequencePooler(
        pooling=get_seq_pooling_method(method),
        head=EmbeddingPoolerHead(
            head_dtype=model_config.head_dtype,
            projector=RowLinear(t("pooler.dense.weight"), t("pooler.dense.bias"), torch.tanh)))
    bias = t("classifier.bias") if "classifier.bias" in heads else None
    return pooling, RowLinear(t("classifier.weight"), bias)
