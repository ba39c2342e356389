"""BERT-class encoders (BERT, RoBERTa, XLM-RoBERTa) from a pooling engine against
transformers' own forward of the same checkpoints: embedding models (CLS or mean
pooling, normalised or not), cross-encoders scoring pairs (token types for BERT),
a three-label classifier; batch invariance; prompts past the position embeddings'
reach refused; families and layouts not served refused at startup."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.e2e.conftest import PROMPTS, make_llm
from tests.encoder_models import cached_encoder_model
from tests.pooling_models import cosine, sigmoid, softmax

QUERY = "Which city has many people who lived there"


def _llm(path, **kwargs):
    # The tiny encoders hold 256 positions: the engine's own limit, not make_llm's.
    return make_llm(path, max_model_len=None, **kwargs)


def _reference(path, task: str):
    import torch
    import transformers

    auto = (transformers.AutoModel if task == "embed"
            else transformers.AutoModelForSequenceClassification)
    return auto.from_pretrained(str(path), dtype=torch.float32).eval()


def _run(model, ids: list[int], types: list[int] | None = None):
    import torch

    kwargs = {"input_ids": torch.tensor([ids])}
    if types is not None:
        kwargs["token_type_ids"] = torch.tensor([types])
    with torch.no_grad():
        return model(**kwargs)


@pytest.mark.parametrize("kind,pooling,normalize", [
    ("bert", "cls", True), ("bert", "mean", False), ("xlm-roberta", "cls", True),
    ("roberta", "mean", True)])
def test_embeddings_match_transformers(kind, pooling, normalize):
    path = cached_encoder_model(kind, task="embed", pooling=pooling, normalize=normalize)
    llm = _llm(path, runner="pooling")
    assert set(llm.supported_tasks) == {"embed", "token_embed"}
    reference = _reference(path, "embed")
    outputs = llm.embed(PROMPTS)
    for out in outputs:
        hidden = _run(reference, out.prompt_token_ids).last_hidden_state[0].double().numpy()
        want = hidden[0] if pooling == "cls" else hidden.mean(axis=0)
        if normalize:
            want = want / np.linalg.norm(want)
        got = np.array(out.outputs.embedding, np.float64)
        assert cosine(got, want) > 0.9999
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    alone, = llm.embed([PROMPTS[5]])
    assert alone.outputs.embedding == outputs[5].outputs.embedding


@pytest.mark.parametrize("kind", ["bert", "xlm-roberta"])
def test_cross_encoder_scores_match_transformers(kind):
    from transformers import AutoTokenizer

    path = cached_encoder_model(kind, task="classify", num_labels=1)
    llm = _llm(path)
    assert set(llm.supported_tasks) == {"classify", "token_classify"}
    reference = _reference(path, "classify")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    outputs = llm.score(QUERY, PROMPTS)
    for doc, out in zip(PROMPTS, outputs):
        pair = tokenizer(QUERY, doc)
        assert out.prompt_token_ids == pair["input_ids"]
        logits = _run(reference, pair["input_ids"], pair.get("token_type_ids")).logits[0]
        assert out.outputs.score == pytest.approx(float(sigmoid(logits.double())[0]), abs=1e-5)
    assert len({round(o.outputs.score, 5) for o in outputs}) > 1
    alone, = llm.score(QUERY, PROMPTS[3:4])
    assert alone.outputs.score == outputs[3].outputs.score


def test_token_types_reach_the_encoder():
    """A BERT pair's second text has token type 1: the same ids with every type 0 (a
    classify request of the pair's ids alone) score differently."""
    path = cached_encoder_model("bert", task="classify", num_labels=1)
    llm = _llm(path)
    scored, = llm.score(QUERY, PROMPTS[:1])
    untyped, = llm.classify([{"prompt_token_ids": scored.prompt_token_ids}])
    assert abs(untyped.outputs.probs[0] - scored.outputs.score) > 1e-4


def test_three_labels_match_transformers():
    path = cached_encoder_model("bert", task="classify", num_labels=3)
    llm = _llm(path)
    reference = _reference(path, "classify")
    for out in llm.classify(PROMPTS):
        want = softmax(_run(reference, out.prompt_token_ids).logits[0].double().numpy())
        np.testing.assert_allclose(out.outputs.probs, want, atol=1e-5)


def test_prompts_past_the_positions_are_refused():
    # RoBERTa numbers positions from padding_idx + 1: 258 embeddings hold 256 tokens.
    path = cached_encoder_model("xlm-roberta", task="embed")
    llm = _llm(path, runner="pooling")
    assert llm.llm_engine.model_config.max_model_len == 256
    with pytest.raises(Exception, match="maximum context length is 256"):
        llm.embed([{"prompt_token_ids": [5] * 257}])
    assert len(llm.embed([{"prompt_token_ids": [5] * 256}])) == 1


def test_encoders_not_served_are_refused_at_startup(tmp_path):
    from vllm.engine.arg_utils import EngineArgs

    source = cached_encoder_model("bert", task="embed")
    for change, named in ((dict(position_embedding_type="relative_key"), "relative_key"),
                          (dict(hidden_act="swish"), "swish")):
        path = tmp_path / named
        shutil.copytree(source, path)
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(Exception, match=named):
            EngineArgs(model=str(path), runner="pooling").create_engine_config()


def test_an_encoder_keeps_nothing_of_finished_requests():
    """vLLM names a step's finished requests in the next step: what the runner holds
    after three rounds is the last round's requests at most."""
    path = cached_encoder_model("bert", task="classify", num_labels=1)
    llm = _llm(path)
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    rounds = [{o.request_id for o in llm.score(QUERY, PROMPTS)} for _ in range(3)]
    for held in (runner.pooling._prompts, runner.pooling._params):
        assert {r.split("-")[0] for r in held} <= rounds[-1]


def test_weights_in_pytorch_model_bin_load_as_safetensors_do(tmp_path):
    import torch
    from safetensors.torch import load_file

    source = cached_encoder_model("bert", task="embed")
    path = tmp_path / "bin"
    shutil.copytree(source, path)
    (path / "model.safetensors").unlink()
    torch.save(load_file(str(source / "model.safetensors")), str(path / "pytorch_model.bin"))
    from_bin, = _llm(path, runner="pooling").embed([PROMPTS[1]])
    from_safetensors, = _llm(source, runner="pooling").embed([PROMPTS[1]])
    assert from_bin.outputs.embedding == from_safetensors.outputs.embedding
