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


@pytest.mark.parametrize("period", [None, 6], ids=["no_period", "period_6"])
def test_gemma3_layer_kinds_follow_layer_types(tmp_path, period):
    # Gemma 3's layer kinds are layer_types (transformers builds those); mlx-lm reads a
    # period (default 6), which transformers 5 does not save and which need not match:
    # the engine must still make layers 1 and 3 global. The prompts are longer than the
    # window (16), so a global layer built as a sliding one answers differently.
    import torch
    import transformers
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from tests.family_models import cached_family_model

    source = cached_family_model("gemma3_text")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    model.save_pretrained(str(tmp_path))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (source / name).exists():
            shutil.copy(source / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("sliding_window_pattern", None)
    config.pop("_sliding_window_pattern", None)
    if period is not None:
        config["sliding_window_pattern"] = period
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert config["layer_types"][1::2] == ["full_attention"] * (len(config["layer_types"]) // 2)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    llm = make_llm(tmp_path)
    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
    prompts = [" ".join(PROMPTS[:3]), " ".join(PROMPTS[1:5])]
    for out in llm.generate(prompts, params, use_tqdm=False):
        assert len(out.prompt_token_ids) > 2 * 16
        ids = torch.tensor([out.prompt_token_ids])
        want = model.generate(ids, max_new_tokens=TOKENS, do_sample=False,
                              min_new_tokens=TOKENS,
                              pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:]
        assert list(out.outputs[0].token_ids) == want.tolist()
