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
