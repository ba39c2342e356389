"""MLX 4- and 8-bit checkpoints of every listed family (and MXFP4 experts of
the MoE ones): the paged forward on the fast CPU path equals mlx-lm's own
forward of the same quantized file."""

import mlx.core as mx
import pytest
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

from tests.family_models import FAMILIES, cached_family_model
from tests.models.test_family_sweep import paged_logits
from vllm_metal.cpu.backend import CpuBackend
from vllm_metal.v1.model_lifecycle import load_model

pytestmark = pytest.mark.usefixtures("exact_arithmetic")

_TOKENS = list(range(20, 60))


# MoE families whose experts mlx-lm can store in MXFP4 (as gpt-oss ships).
MXFP4_FAMILIES = ["gpt_oss", "qwen3_moe", "mixtral"]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_quantized_family_matches_mlx_lm(family, bits):
    _check_quantized(cached_family_model(family, quantize_bits=bits))


@pytest.mark.parametrize("family", MXFP4_FAMILIES)
def test_mxfp4_experts_match_mlx_lm(family):
    """Experts in MXFP4, the rest 8-bit affine (mlx-community's gpt-oss MXFP4-Q8)."""
    _check_quantized(cached_family_model(family, quantize_bits=8, quantize_mode="mxfp4"))


def _check_quantized(path):
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model as mlx_load

    reference, _ = mlx_load(path)
    want = reference(mx.array([_TOKENS]), cache=make_prompt_cache(reference))[0]
    loaded = load_model(str(path), mx.float32, CpuBackend())
    got = paged_logits(loaded.adapter, _TOKENS, backbone=loaded.backbone)
    # MLX's quantized matmul and ours sum in different orders: fp32 noise only.
    scale = max(float(mx.abs(want).max()), 1.0)
    assert float(mx.abs(got - want).max()) <= 2e-3 * scale
    assert (got.argmax(-1) == want.argmax(-1)).all().item()
    # MoE families: every expert layer runs vllm-metal's expert matmul.
    assert not [name for name, m in loaded.model.named_modules()
                if type(m) in (SwitchLinear, QuantizedSwitchLinear)]
