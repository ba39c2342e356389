"""Loading and build modes of vllm_metal.native.get_ops: the kernels_v2 hash stamp,
the macOS library configuration (prebuilt .metallib or one-source JIT), and
VLLM_METAL_BUILD_FROM_SOURCE on Linux."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import vllm_metal.native as loader
from tests.kernels.test_compile import INSTANTIATED, NAX_KERNELS
from tools.msl_harness import MslLibrary
from vllm_metal.native import constants, get_ops, kernel_sources

REPO = Path(__file__).resolve().parents[2]


class RecordingExt(types.SimpleNamespace):
    """Stands in for _ext where only the library configuration calls matter."""

    def _set_metal_library_path(self, path):
        self.path = path

    def _set_metal_library_source(self, source):
        self.source = source

    def _set_metal_tensor_library_path(self, path):
        self.tensor_path = path

    def _set_metal_tensor_library_source(self, source):
        self.tensor_source = source


def test_stamp_recipe_matches_the_build():
    assert kernel_sources.kernels_hash(REPO / "kernels_v2") == get_ops().kernels_hash


def test_changed_kernel_source_is_refused_as_stale(tmp_path):
    copy = tmp_path / "kernels_v2"
    shutil.copytree(REPO / "kernels_v2", copy)
    loader.check_kernels_stamp(get_ops().kernels_hash, copy)  # unchanged copy: accepted
    path = copy / "paged_attention_gqa_decode.h"
    path.write_text(path.read_text() + "\n// edited\n")
    with pytest.raises(ImportError, match="stale kernels.*VLLM_METAL_BUILD_FROM_SOURCE=1"):
        loader.check_kernels_stamp(get_ops().kernels_hash, copy)


def test_wheel_without_sources_has_nothing_to_compare():
    loader.check_kernels_stamp("any", None)


def test_prebuilt_metallib_is_used_and_a_missing_one_refused(tmp_path):
    ext = RecordingExt(__file__=str(tmp_path / "_ext.so"))
    with pytest.raises(ImportError, match="vllm_metal_kernels.metallib is missing"):
        loader._configure_metal(ext, from_source=False)
    (tmp_path / loader.METALLIB_NAME).write_bytes(b"metallib")
    assert loader._configure_metal(ext, from_source=False) == f"prebuilt {loader.METALLIB_NAME}"
    assert ext.path == str(tmp_path / loader.METALLIB_NAME)
    assert not hasattr(ext, "tensor_path")  # a toolchain without Metal 4 built none: not an error


def test_a_prebuilt_tensor_library_is_configured_beside_the_main_one(tmp_path):
    ext = RecordingExt(__file__=str(tmp_path / "_ext.so"))
    for name in (loader.METALLIB_NAME, loader.TENSOR_METALLIB_NAME):
        (tmp_path / name).write_bytes(b"metallib")
    how = loader._configure_metal(ext, from_source=False)
    assert how == f"prebuilt {loader.METALLIB_NAME} and {loader.TENSOR_METALLIB_NAME}"
    assert ext.path == str(tmp_path / loader.METALLIB_NAME)
    assert ext.tensor_path == str(tmp_path / loader.TENSOR_METALLIB_NAME)


def test_jit_source_holds_every_kernel_and_compiles(tmp_path):
    ext = RecordingExt(__file__=str(tmp_path / "_ext.so"))
    assert "JIT" in loader._configure_metal(ext, from_source=True)
    assert ext.source.startswith(f"#define VLLM_METAL_PARTITION_SIZE {constants.PARTITION_SIZE}\n")
    assert ext.source.isascii()  # MLX hands the string to Metal as ASCII
    # MLX compiles the string as one file: it must compile on the harness as one file too.
    single = tmp_path / "all_kernels.metal"
    single.write_text(ext.source)
    library = MslLibrary(single, defines={}, cache_dir=REPO / "build" / "msl_harness")
    # Every kernel but the tensor-op ones (NaxPrefill), which have a library of their own.
    assert len(library.kernels) == INSTANTIATED - NAX_KERNELS
    assert not any(k.startswith("paged_attention_nax_prefill") for k in library.kernels)
    assert "MetalPerformancePrimitives" not in ext.source


def test_jit_tensor_source_holds_the_tensor_op_kernels_and_compiles(tmp_path):
    ext = RecordingExt(__file__=str(tmp_path / "_ext.so"))
    loader._configure_metal(ext, from_source=True)
    assert ext.tensor_source.startswith(f"#define VLLM_METAL_PARTITION_SIZE {constants.PARTITION_SIZE}\n")
    assert ext.tensor_source.isascii()
    single = tmp_path / "tensor_kernels.metal"
    single.write_text(ext.tensor_source)
    library = MslLibrary(single, defines={}, cache_dir=REPO / "build" / "msl_harness")
    assert len(library.kernels) == NAX_KERNELS
    assert all(k.startswith("paged_attention_nax_prefill") for k in library.kernels)


def test_the_build_finds_tensor_op_files_without_the_package():
    # CMake runs kernel_sources.py as a script with the build's Python, where
    # vllm_metal need not be importable (-I -S: no site-packages, no PYTHONPATH).
    script = REPO / "vllm_metal" / "native" / "kernel_sources.py"
    run = subprocess.run([sys.executable, "-I", "-S", str(script), "tensor-op-files",
                          str(REPO / "kernels_v2")], capture_output=True, text=True, check=True)
    assert run.stdout.split() == [p.name for p in kernel_sources.tensor_op_files(REPO / "kernels_v2")]
    assert run.stdout.split() == ["paged_attention_nax_prefill.metal"]


def test_a_tensor_op_file_is_found_through_its_local_headers(tmp_path):
    (tmp_path / "ops.h").write_text(
        "#pragma once\n#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>\n")
    (tmp_path / "a.metal").write_text('#include "ops.h"\nkernel void a() {}\n')
    (tmp_path / "b.metal").write_text("#include <metal_stdlib>\nkernel void b() {}\n")
    assert [p.name for p in kernel_sources.tensor_op_files(tmp_path)] == ["a.metal"]
    assert "kernel void a()" in kernel_sources.metal_source(tmp_path, tensor_ops=True)
    assert "kernel void a()" not in kernel_sources.metal_source(tmp_path)
    (tmp_path / "a.metal").unlink()
    assert kernel_sources.metal_source(tmp_path, tensor_ops=True) == ""  # no library to configure


def test_probe_reads_the_installed_extension_in_a_child_process():
    from vllm_metal.native import build

    assert build.probe_extension() == build.extension_facts(get_ops())


@pytest.mark.parametrize("edit,reason", [
    ({}, None),
    ({"mlx_version": "0.0.1"}, "built against MLX 0.0.1"),
    ({"partition_size": 256}, "constants.py changed"),
    ({"block_sizes": [16]}, "constants.py changed"),
    ({"kernels_hash": "0" * 64}, "kernels_v2/ changed"),
], ids=["current", "mlx", "partition", "blocks", "kernels"])
def test_stale_reason_names_what_changed(edit, reason):
    import mlx.core as mx

    from vllm_metal.native import build

    facts = dict(build.extension_facts(get_ops()), **edit)
    found = build.stale_reason(facts, REPO, mx.__version__)
    assert found is None if reason is None else reason in found
    assert "does not import" in build.stale_reason(None, REPO, mx.__version__)


class FakeBuild:
    """Records the build steps _load_from_source takes; the probe reports `facts`."""

    def __init__(self, monkeypatch, facts):
        from vllm_metal.native import build

        self.rebuilt, self.compiled = [], []
        monkeypatch.setattr(build, "probe_extension", lambda: facts)
        monkeypatch.setattr(build, "rebuild_extension", self.rebuilt.append)
        monkeypatch.setattr(build, "compile_on_harness", lambda root: self.compiled.append(root) or 1)


@pytest.mark.parametrize("platform", ["linux", "darwin"])
def test_stale_extension_is_rebuilt_before_its_first_import(monkeypatch, platform):
    from vllm_metal.native import build

    stale = dict(build.extension_facts(get_ops()), kernels_hash="0" * 64)
    fake = FakeBuild(monkeypatch, stale)
    # As in a fresh process: the extension not imported yet (the probe ran in a child).
    monkeypatch.delitem(sys.modules, "vllm_metal._ext")
    monkeypatch.setattr(sys, "platform", platform)
    assert loader._load_from_source() is get_ops()
    assert fake.rebuilt == [REPO]
    assert fake.compiled == ([REPO] if platform == "linux" else [])  # macOS JIT-compiles instead


def test_current_extension_is_not_rebuilt(monkeypatch):
    from vllm_metal.native import build

    fake = FakeBuild(monkeypatch, build.extension_facts(get_ops()))
    monkeypatch.delitem(sys.modules, "vllm_metal._ext")
    monkeypatch.setattr(sys, "platform", "linux")
    loader._load_from_source()
    assert (fake.rebuilt, fake.compiled) == ([], [REPO])


def test_stale_extension_already_imported_is_refused(monkeypatch, tmp_path):
    ext = get_ops()
    copy = tmp_path / "kernels_v2"
    shutil.copytree(REPO / "kernels_v2", copy)
    (copy / "reshape_and_cache.h").write_text("// changed\n")
    fake_root = tmp_path
    (fake_root / "csrc").mkdir()
    monkeypatch.setattr(kernel_sources, "source_tree", lambda: fake_root)
    fake = FakeBuild(monkeypatch, None)
    with pytest.raises(ImportError, match=r"stale \(kernels_v2/ changed\) and already imported"):
        loader._load_from_source()
    assert fake.rebuilt == []
    assert ext is get_ops()


def test_build_from_source_on_linux_recompiles_the_kernels_on_the_harness():
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
            "from vllm_metal.native import get_ops\n"
            "print('hash', get_ops().kernels_hash)\n")
    env = dict(os.environ, VLLM_METAL_BUILD_FROM_SOURCE="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    result = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True,
                            timeout=600, cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    assert f"compiled on the MSL CPU harness ({INSTANTIATED} kernels)" in log
    assert "Native paged-attention CPU kernels loaded" in log
