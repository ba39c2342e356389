"""register(): the decision, the env override, and the early process defaults."""

import os
import subprocess
import sys

import pytest

import vllm_metal
from vllm_metal import envs


def test_register_claims_a_linux_machine_without_accelerators(monkeypatch):
    monkeypatch.delenv("VLLM_METAL_PLATFORM", raising=False)
    if sys.platform.startswith("linux") and vllm_metal._other_accelerator_present():
        pytest.skip("an accelerator platform claims this machine")
    assert vllm_metal.register() == "vllm_metal.platform.MetalPlatform"


def test_env_declines(monkeypatch):
    monkeypatch.setenv("VLLM_METAL_PLATFORM", "0")
    assert vllm_metal.register() is None


def test_env_forces_even_when_another_accelerator_claims(monkeypatch):
    monkeypatch.setenv("VLLM_METAL_PLATFORM", "force")
    monkeypatch.setattr(vllm_metal, "_other_accelerator_present", lambda: True)
    assert vllm_metal.register() == vllm_metal.PLATFORM_QUALNAME
    monkeypatch.setenv("VLLM_METAL_PLATFORM", "auto")
    assert vllm_metal.register() is None


def test_invalid_env_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("VLLM_METAL_PLATFORM", "sometimes")
    with pytest.raises(ValueError, match="VLLM_METAL_PLATFORM"):
        envs.VLLM_METAL_PLATFORM


def test_process_defaults_do_not_override_the_user(monkeypatch):
    monkeypatch.setenv("MLX_MAX_OPS_PER_BUFFER", "7")
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    vllm_metal.apply_process_defaults()
    assert os.environ["MLX_MAX_OPS_PER_BUFFER"] == "7"
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"


def test_vllm_resolves_this_platform_in_a_fresh_process():
    code = "import vllm.platforms as p; print(type(p.current_platform).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "VLLM_METAL_PLATFORM": "auto"})
    assert out.stdout.strip().splitlines()[-1] == "MetalPlatform", out.stderr[-2000:]


def test_platform_reports_memory_and_dtypes():
    from vllm_metal.backend import system_memory_bytes
    from vllm_metal.platform import MetalPlatform

    platform = MetalPlatform()
    assert MetalPlatform.get_device_total_memory() > 0
    if sys.platform.startswith("linux"):
        assert MetalPlatform.get_device_total_memory() == system_memory_bytes()
    assert platform.supported_dtypes[0] is not None


def test_own_variables_pass_vllms_environment_check(monkeypatch, caplog):
    from vllm_metal.platform import MetalPlatform

    monkeypatch.setenv("VLLM_METAL_CPU_INT8_ACTIVATIONS", "1")
    monkeypatch.setenv("VLLM_METAL_CPU_THREADS", "2")
    MetalPlatform.validate_environ(hard_fail=True)   # ours are known: no error
    monkeypatch.setenv("VLLM_METAL_NO_SUCH_SETTING", "1")
    with pytest.raises(ValueError, match="VLLM_METAL_NO_SUCH_SETTING"):
        MetalPlatform.validate_environ(hard_fail=True)
    with caplog.at_level("WARNING"):
        MetalPlatform.validate_environ(hard_fail=False)
    assert "VLLM_METAL_NO_SUCH_SETTING" in caplog.text
    assert "VLLM_METAL_CPU_THREADS" not in caplog.text


def test_a_bad_value_of_an_own_variable_fails_the_environment_check(monkeypatch):
    from vllm_metal.platform import MetalPlatform

    monkeypatch.setenv("VLLM_METAL_CPU_KV_CACHE_DTYPE", "fp8")
    with pytest.raises(ValueError, match="VLLM_METAL_CPU_KV_CACHE_DTYPE.*float16"):
        MetalPlatform.validate_environ(hard_fail=False)
