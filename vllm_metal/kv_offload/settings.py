"""Which KV transfer configurations this platform serves, and the routing of vLLM's
offloading connector to MetalOffloadingSpec."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_metal.config_checks import UnsupportedConfigError

if TYPE_CHECKING:
    from vllm.config import VllmConfig

CONNECTOR = "OffloadingConnector"
SPEC_NAME = "MetalOffloadingSpec"
SPEC_MODULE = "vllm_metal.kv_offload.spec"
# kv_connector_extra_config key the config checks fill with what decides a block's
# bytes on this platform (layout_identity).
LAYOUT_KEY = "vllm_metal_layout"
# vLLM's spec names for its host tier and its host + secondary tiers: both are served
# by MetalOffloadingSpec (secondary_tiers decides which).
VLLM_SPECS = ("CPUOffloadingSpec", "TieringOffloadingSpec", SPEC_NAME)
# Bumped when the bytes of an offloaded block change meaning on this platform.
LAYOUT_VERSION = 2  # 2: the CPU backend keeps float key pages as columns


def route_kv_transfer(vllm_config: VllmConfig) -> None:
    """Refuse KV transfer configurations the runner cannot serve, naming the flag, and
    point vLLM's offloading connector at MetalOffloadingSpec. Idempotent."""
    _resolve_offloading_size(vllm_config)
    transfer = vllm_config.kv_transfer_config
    if transfer is None or transfer.kv_connector is None:
        return
    usage = (f"vllm-metal offloads KV blocks through vLLM's {CONNECTOR} "
             "(--kv-offloading-size GiB, or --kv-transfer-config with "
             f'"kv_connector": "{CONNECTOR}")')
    if transfer.kv_connector != CONNECTOR:
        hint = (" (unset VLLM_USE_SIMPLE_KV_OFFLOAD)"
                if transfer.kv_connector == "SimpleCPUOffloadConnector" else "")
        raise UnsupportedConfigError(
            f"KV connector {transfer.kv_connector} is not supported{hint}; {usage}")
    if transfer.kv_role not in (None, "kv_both"):
        raise UnsupportedConfigError(
            f"kv_role {transfer.kv_role} is not supported with {CONNECTOR}; use kv_both")
    extra = transfer.kv_connector_extra_config
    spec = extra.get("spec_name", "CPUOffloadingSpec")
    if spec not in VLLM_SPECS or extra.get("spec_module_path") not in (None, SPEC_MODULE):
        raise UnsupportedConfigError(
            f"offloading spec {spec} is not supported; use spec_name CPUOffloadingSpec "
            "(host memory) or TieringOffloadingSpec (host memory and secondary_tiers, "
            "such as vLLM's fs disk tier)")
    if not extra.get("cpu_bytes_to_use"):
        raise UnsupportedConfigError(
            f"{CONNECTOR} needs cpu_bytes_to_use in kv_connector_extra_config (or use "
            "--kv-offloading-size GiB)")
    parallel = vllm_config.parallel_config
    if parallel.distributed_executor_backend not in (None, "uni"):
        raise UnsupportedConfigError(
            f"KV offloading runs with the uniprocess executor; got "
            f"--distributed-executor-backend {parallel.distributed_executor_backend}")
    speculative = vllm_config.speculative_config
    from vllm_metal.spec_decode.support import CACHELESS_METHODS

    if speculative is not None and speculative.method not in CACHELESS_METHODS:
        raise UnsupportedConfigError(
            f"KV offloading does not carry a drafter's cache: speculative method "
            f"{speculative.method} is not supported with {CONNECTOR}; use ngram or no "
            "speculation")
    # By module path, not vLLM's spec registry: the engine core process unpickles
    # this config without running the platform's checks again.
    extra["spec_name"] = SPEC_NAME
    extra["spec_module_path"] = SPEC_MODULE
    extra[LAYOUT_KEY] = layout_identity(vllm_config)
    transfer.kv_role = "kv_both"


def _resolve_offloading_size(vllm_config: VllmConfig) -> None:
    """--kv-offloading-size as vLLM turns it into a connector config, which it does
    after the platform's checks (the same settings, so its own pass changes nothing)."""
    cache = vllm_config.cache_config
    if cache.kv_offloading_size is None:
        return
    if cache.kv_offloading_backend != "native":
        raise UnsupportedConfigError(
            f"--kv-offloading-backend {cache.kv_offloading_backend} is not supported; use "
            "native")
    from vllm import envs as vllm_envs
    from vllm.config import KVTransferConfig

    if vllm_envs.VLLM_USE_SIMPLE_KV_OFFLOAD:
        raise UnsupportedConfigError(
            "VLLM_USE_SIMPLE_KV_OFFLOAD selects SimpleCPUOffloadConnector, which is not "
            f"supported; unset it to use {CONNECTOR}")
    if vllm_config.kv_transfer_config is None:
        vllm_config.kv_transfer_config = KVTransferConfig()
    transfer = vllm_config.kv_transfer_config
    transfer.kv_connector = CONNECTOR
    transfer.kv_role = "kv_both"
    transfer.kv_connector_extra_config["cpu_bytes_to_use"] = cache.kv_offloading_size * (1 << 30)


def layout_identity(vllm_config: VllmConfig) -> str:
    """What decides an offloaded block's bytes here beyond the model and vLLM's cache
    dtype: the backend, the compute mode (int8 activations give other K/V values
    than fp32), the CPU cache dtype setting, the block size and this layout's
    version. A disk tier keys its directory by it."""
    import mlx.core as mx

    from vllm_metal import envs

    backend = "metal" if mx.metal.is_available() else "cpu"
    return (f"vllm-metal-kv/{LAYOUT_VERSION};backend={backend};"
            f"block={vllm_config.cache_config.block_size};"
            f"int8={envs.VLLM_METAL_CPU_INT8_ACTIVATIONS};"
            f"cpu_kv={envs.VLLM_METAL_CPU_KV_CACHE_DTYPE};"
            f"stack={envs.VLLM_METAL_CPU_DECODER_STACK}")

