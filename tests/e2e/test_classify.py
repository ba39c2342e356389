"""Classification, score and rerank from a pooling engine (`--convert classify`)
against transformers: a `*ForSequenceClassification` checkpoint (its own score
matrix; one label as a cross-encoder, three as a classifier) and an LLM used as a
reranker the way Qwen3-Reranker is served (`classifier_from_token` through the LM
head, `from_2_way_softmax`)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.conftest import PROMPTS, make_llm
from tests.pooling_models import (cached_classifier_model, reference_logits,
                                  sigmoid, softmax)
from tests.tiny_models import cached_tiny_model

QUERY = "Which city has many people who lived there"
DOCS = PROMPTS[:4]
# Two tokens of the tiny tokenizer's vocabulary, as "no" and "yes" are Qwen3-Reranker's.
FALSE_TRUE = ["Ġof", "Ġthe"]


@pytest.fixture(scope="module")
def scorer_dir():
    return cached_classifier_model("qwen3", num_labels=1)


@pytest.fixture(scope="module")
def scorer(scorer_dir):
    return make_llm(scorer_dir)


def test_a_sequence_classification_checkpoint_is_a_pooling_engine(scorer):
    config = scorer.llm_engine.model_config
    assert (config.runner_type, config.convert_type) == ("pooling", "classify")
    assert set(scorer.supported_tasks) == {"classify", "token_classify"}


def test_one_label_probabilities_match_transformers(scorer, scorer_dir):
    outputs = scorer.classify(PROMPTS)
    for out in outputs:
        want = sigmoid(reference_logits(scorer_dir, out.prompt_token_ids))
        np.testing.assert_allclose(out.outputs.probs, want, atol=1e-5)


def test_three_labels_softmax_matches_transformers():
    path = cached_classifier_model("llama", num_labels=3)
    llm = make_llm(path)
    for out in llm.classify(PROMPTS):
        want = softmax(reference_logits(path, out.prompt_token_ids))
        np.testing.assert_allclose(out.outputs.probs, want, atol=1e-5)
        assert abs(sum(out.outputs.probs) - 1.0) < 1e-5


def test_scores_of_pairs_match_transformers_and_classify(scorer, scorer_dir):
    outputs = scorer.score(QUERY, DOCS)
    assert len(outputs) == len(DOCS)
    for out in outputs:
        want = sigmoid(reference_logits(scorer_dir, out.prompt_token_ids))[0]
        assert abs(out.outputs.score - want) < 1e-5
        # Scored in a batch of four, classified alone: the same bits.
        alone, = scorer.classify([{"prompt_token_ids": out.prompt_token_ids}])
        assert alone.outputs.probs[0] == out.outputs.score


def test_an_llm_reranker_scores_by_its_tokens_logits():
    path = cached_tiny_model("qwen3")
    llm = make_llm(path, hf_overrides={
        "architectures": ["Qwen3ForSequenceClassification"],
        "classifier_from_token": FALSE_TRUE, "is_original_qwen3_reranker": True})
    from transformers import AutoTokenizer

    false_id, true_id = AutoTokenizer.from_pretrained(str(path)).convert_tokens_to_ids(FALSE_TRUE)
    outputs = llm.score(QUERY, DOCS)
    for out in outputs:
        logits = reference_logits(path, out.prompt_token_ids, causal=True)
        want = sigmoid(np.array([logits[true_id] - logits[false_id]]))[0]
        assert abs(out.outputs.score - want) < 1e-5
    assert len({round(o.outputs.score, 6) for o in outputs}) > 1   # not one constant
    alone, = llm.score(QUERY, DOCS[2:3])
    assert alone.outputs.score == outputs[2].outputs.score
