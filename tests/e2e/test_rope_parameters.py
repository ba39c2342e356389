"""Checkpoints saved by transformers 5 keep their rotary settings in
`rope_parameters` only (no `rope_theta`, no `rope_scaling`); mlx-lm's Llama reads
the old keys and would rotate with base 10000. Greedy tokens from such a checkpoint
against transformers' own generate on it."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.e2e.conftest import PROMPTS, make_llm
from tests.tiny_models import make_tiny_model

TOKENS = 12


@pytest.fixture(scope="module", params=[None, "llama3"])
def saved_by_transformers(request, tmp_path_factory):
    import torch
    import transformers

    root = tmp_path_factory.mktemp("rope")
    source = make_tiny_model(root / "source", "llama", rope_scaling=request.param)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    model.save_pretrained(str(root / "saved"))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(source / name, root / "saved" / name)
    config = json.loads((root / "saved" / "config.json").read_text())
    assert "rope_theta" not in config and "rope_scaling" not in config
    assert config["rope_parameters"]["rope_theta"] == 500000.0
    return root / "saved", model


def test_greedy_tokens_match_transformers(saved_by_transformers):
    import torch
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    path, reference = saved_by_transformers
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    llm = make_llm(path)
    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
    for out in llm.generate(PROMPTS[:4], params, use_tqdm=False):
        ids = torch.tensor([out.prompt_token_ids])
        want = reference.generate(ids, max_new_tokens=TOKENS, do_sample=False,
                                  min_new_tokens=TOKENS,
                                  pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:]
        assert list(out.outputs[0].token_ids) == want.tolist()
