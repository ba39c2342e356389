"""Every dense family through ``vllm serve`` and the ``openai`` client: greedy
text and per-token logprobs equal mlx-lm's.

One server per family (about 15 s each to start), so the matrix is marked slow
and run by CI after the README's test command.
"""

import numpy as np
import pytest

from tests.e2e import mlx_reference
from tests.e2e.server import VllmServer
from tests.family_models import FAMILIES, REMOTE_CODE, cached_family_model

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time, in a land far away, there lived a"
MAX_TOKENS = 12
LOGPROB_TOL = 2e-3


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_serves_mlx_lm_greedy_text_and_logprobs(family):
    from openai import OpenAI

    model_dir = cached_family_model(family)
    args = ["--max-model-len", "256", "--served-model-name", family]
    if family in REMOTE_CODE:
        args.append("--trust-remote-code")
    server = VllmServer(str(model_dir), *args)
    try:
        client = OpenAI(base_url=server.base_url + "/v1", api_key="none")
        out = client.completions.create(
            model=family, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, logprobs=3,
            extra_body={"return_tokens_as_token_ids": True})
    finally:
        server.stop()
    choice = out.choices[0]
    prompt_ids = mlx_reference.tokenize(model_dir, PROMPT)
    assert choice.text == mlx_reference.greedy_text(model_dir, prompt_ids, MAX_TOKENS)
    tokens = [int(t.removeprefix("token_id:")) for t in choice.logprobs.tokens]
    assert tokens == mlx_reference.greedy_tokens(model_dir, prompt_ids, MAX_TOKENS)
    dense = mlx_reference.full_logprobs(model_dir, prompt_ids + tokens)
    rows = dense[len(prompt_ids) - 1:len(prompt_ids) - 1 + len(tokens)]
    np.testing.assert_allclose(choice.logprobs.token_logprobs,
                               rows[np.arange(len(tokens)), tokens], atol=LOGPROB_TOL)
    for step, top in enumerate(choice.logprobs.top_logprobs):
        np.testing.assert_allclose(sorted(top.values(), reverse=True),
                                   np.sort(rows[step])[::-1][:3], atol=LOGPROB_TOL)


def test_multimodal_checkpoint_answers_text_and_refuses_images():
    # Gemma 3's multimodal checkpoint is served by its language model alone:
    # an image part is refused (HTTP 400), not read as placeholder tokens.
    import base64

    import requests

    model_dir = cached_family_model("gemma3")
    server = VllmServer(str(model_dir), "--max-model-len", "256", "--served-model-name", "g3")
    try:
        pixel = base64.b64encode(bytes.fromhex(
            "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
            "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")).decode()
        image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{pixel}"}}
        body = {"model": "g3", "max_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]}
        refused = requests.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
        text = {"model": "g3", "max_tokens": 4,
                "messages": [{"role": "user", "content": "What is this?"}]}
        answered = requests.post(server.base_url + "/v1/chat/completions", json=text, timeout=60)
    finally:
        server.stop()
    assert refused.status_code == 400, refused.text
    assert answered.status_code == 200, answered.text
