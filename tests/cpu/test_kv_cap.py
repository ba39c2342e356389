"""The CPU backend's KV cache cap: VLLM_METAL_CPU_KV_CACHE_GIB, within what the host can
spare."""

from __future__ import annotations

from vllm_metal.cpu import kv_cap


def test_the_configured_cap_when_the_host_has_room(monkeypatch):
    monkeypatch.setenv("VLLM_METAL_CPU_KV_CACHE_GIB", "1.5")
    monkeypatch.setattr(kv_cap, "available_host_memory", lambda: 64 * 2**30)
    assert kv_cap.kv_cache_cap() == int(1.5 * 2**30)


def test_never_more_than_the_host_can_spare(monkeypatch):
    monkeypatch.setenv("VLLM_METAL_CPU_KV_CACHE_GIB", "4")
    monkeypatch.setattr(kv_cap, "available_host_memory", lambda: 3 * 2**30)
    assert kv_cap.kv_cache_cap() == 3 * 2**30 - kv_cap.HOST_RESERVE
    monkeypatch.setattr(kv_cap, "available_host_memory", lambda: 2**30)
    assert kv_cap.kv_cache_cap() == 0   # the budget then raises to one request


def test_without_meminfo_the_configured_cap(monkeypatch):
    monkeypatch.setenv("VLLM_METAL_CPU_KV_CACHE_GIB", "2")
    monkeypatch.setattr(kv_cap, "available_host_memory", lambda: None)
    assert kv_cap.kv_cache_cap() == 2 * 2**30


def test_reads_memavailable():
    available = kv_cap.available_host_memory()
    assert available is None or available > 0
