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
