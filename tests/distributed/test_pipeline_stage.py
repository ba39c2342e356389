"""Pipeline stages cut from a model: each holds only its layers, and the stages run one
after another, each fed the last one's hidden state, compute what the whole model
computes (mlx-lm's own forward, same ops in the same order: equal bits)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from tests.family_models import make_family_model
from vllm_metal.distributed.pipeline import PipelineStage, StageLink, cut_layers

# Families whose backbones read a layer's kind by its index or attributes: gemma3's
# sliding-window pattern and scaled embeddings, a hybrid's linear/full layers.
CASES = [("llama", 3, 2), ("gemma3_text", 6, 2), ("qwen3_next", 4, 2), ("llama", 5, 3)]


def _load(path):
    from mlx_lm.utils import load_model

    model, _ = load_model(path, lazy=True)
    return model


@pytest.mark.parametrize("family,layers,stages", CASES)
def test_stages_in_turn_compute_the_whole_model(family, layers, stages, tmp_path):
    path = make_family_model(tmp_path / family, family, num_hidden_layers=layers)
    ids = mx.array(np.random.default_rng(0).integers(5, 1000, size=(1, 11)), dtype=mx.int32)
    whole = _load(path)
    want = whole(ids)
    mx.eval(want)

    sent = None
    for rank in range(stages):
        stage = PipelineStage.of(layers, rank, stages)
        model, link = _load(path), StageLink()
        cut_layers(model.model.layers, stage, link)   # the backbone's own list
        names = {n for n, _ in tree_flatten(model.parameters())}
        held = {int(n.split("layers.")[1].split(".")[0]) for n in names if "layers." in n}
        assert held == set(range(stage.start, stage.end))
        link.incoming = sent
        out = model(ids)
        if stage.is_last:
            assert link.outgoing is None
            assert mx.array_equal(out, want).item()
        else:
            assert link.outgoing is not None
            sent = link.outgoing.reshape(-1, link.outgoing.shape[-1])
            mx.eval(sent)


def test_the_split_is_vllms_and_every_stage_gets_a_layer(monkeypatch):
    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION", raising=False)
    spans = [(s.start, s.end) for s in (PipelineStage.of(5, r, 2) for r in range(2))]
    assert spans == [(0, 3), (3, 5)]
    with pytest.raises(ValueError, match="leaves stage 2 no layer"):
        PipelineStage.of(2, 2, 3)
