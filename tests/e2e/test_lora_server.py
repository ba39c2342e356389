"""LoRA through `vllm serve`: --lora-modules and runtime loading pick adapters by model
name; concurrent requests of several adapters and the base model each equal mlx-lm on
the merged checkpoint; a bad adapter is refused with 400 and the server serves on."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests import lora_adapters
from tests.e2e import mlx_reference
from tests.e2e.conftest import PROMPTS
from tests.e2e.server import VllmServer

# A server of its own (the in-process LoRA tests are in the README suite): with the
# slow tests (.ci/run).
pytestmark = pytest.mark.slow

RANK = 8
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def adapters(llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-server")
    made = {}
    for name, seed, writer in (("alpha", 5, "peft"), ("beta", 6, "mlx")):
        updates = lora_adapters.random_updates(llama_dir, rank=RANK, seed=seed)
        path = (lora_adapters.write_peft(root / name, updates, RANK, alpha=2 * RANK)
                if writer == "peft" else
                lora_adapters.write_mlx_lm(root / name, updates, RANK, scale=2.0))
        made[name] = (path, lora_adapters.merged_checkpoint(llama_dir, updates, 2.0,
                                                            root / f"{name}-merged"))
    return made


@pytest.fixture(scope="module")
def server(llama_dir, adapters):
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    srv = VllmServer(str(llama_dir), "--served-model-name", "base", "--enable-lora",
                     "--lora-modules", f"alpha={adapters['alpha'][0]}", "--max-loras", "2",
                     "--max-lora-rank", str(RANK), "--max-model-len", "512",
                     "--max-num-seqs", "8", "--gpu-memory-utilization", "0.3", env=env)
    yield srv
    srv.stop()


def _complete(server, model, prompt_ids):
    resp = requests.post(server.base_url + "/v1/completions", timeout=120, json={
        "model": model, "prompt": prompt_ids, "max_tokens": MAX_TOKENS, "temperature": 0,
        "return_token_ids": True})
    return resp


def _expected(model_dir, prompt_ids):
    return mlx_reference.greedy_tokens(model_dir, prompt_ids, MAX_TOKENS)


def test_models_lists_the_static_adapter(server):
    names = {m["id"] for m in requests.get(server.base_url + "/v1/models").json()["data"]}
    assert {"base", "alpha"} <= names


def test_runtime_load_then_concurrent_mixed_requests(server, llama_dir, adapters):
    resp = requests.post(server.base_url + "/v1/load_lora_adapter", timeout=60,
                         json={"lora_name": "beta", "lora_path": str(adapters["beta"][0])})
    assert resp.status_code == 200, resp.text
    jobs = [(model, mlx_reference.tokenize(llama_dir, prompt))
            for model, prompt in zip(["alpha", "base", "beta", "alpha", "beta", "base"] * 2,
                                     PROMPTS + PROMPTS[:4])]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda job: _complete(server, *job), jobs))
    references = {"base": llama_dir, "alpha": adapters["alpha"][1], "beta": adapters["beta"][1]}
    for (model, prompt_ids), resp in zip(jobs, answers):
        assert resp.status_code == 200, resp.text
        tokens = resp.json()["choices"][0]["token_ids"]
        assert tokens == _expected(references[model], prompt_ids), model


def test_unloaded_adapter_is_gone(server, llama_dir, adapters):
    resp = requests.post(server.base_url + "/v1/load_lora_adapter", timeout=60,
                         json={"lora_name": "gamma", "lora_path": str(adapters["beta"][0])})
    assert resp.status_code == 200, resp.text
    resp = requests.post(server.base_url + "/v1/unload_lora_adapter", timeout=60,
                         json={"lora_name": "gamma"})
    assert resp.status_code == 200, resp.text
    assert _complete(server, "gamma", [1, 2, 3]).status_code == 404


@pytest.mark.parametrize("case", ["rank", "module", "missing"])
def test_bad_adapter_is_a_400_and_the_server_serves_on(server, llama_dir, tmp_path, case):
    if case == "rank":
        updates = lora_adapters.random_updates(llama_dir, ("q_proj",), rank=16)
        path, needle = lora_adapters.write_peft(tmp_path / case, updates, 16, alpha=16), "rank"
    elif case == "module":
        a, b = next(iter(lora_adapters.random_updates(llama_dir, ("q_proj",), rank=4).values()))
        path = lora_adapters.write_peft(tmp_path / case, {"model.layers.0.mlp.w9": (a, b)}, 4,
                                        alpha=4)
        needle = "model.layers.0.mlp.w9"
    else:
        # vLLM replaces paths in error messages with <path>.
        path, needle = tmp_path / "nowhere", "adapter_config.json not found"
    resp = requests.post(server.base_url + "/v1/load_lora_adapter", timeout=60,
                         json={"lora_name": f"bad-{case}", "lora_path": str(path)})
    assert 400 <= resp.status_code < 500, resp.text
    assert needle in resp.text
    assert requests.get(server.base_url + "/health").status_code == 200
    prompt_ids = mlx_reference.tokenize(llama_dir, PROMPTS[0])
    resp = _complete(server, "base", prompt_ids)
    assert resp.json()["choices"][0]["token_ids"] == _expected(llama_dir, prompt_ids)
