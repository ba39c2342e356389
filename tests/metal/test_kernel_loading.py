"""Loading and build modes of vllm_metal.metal.get_ops: the kernels_v2 hash stamp,
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

import vllm_metal.metal as loader
from tools.msl_harness import MslLibrary
from vllm_metal.metal import get_ops, kernel_sources

REPO = Path(__file__).resolve().parents[2]


class RecordingExt(types.SimpleNamespace):
    """Stands in for _ext where only the library configuration calls matter."""

    def _set_metal_library_path(self, path):
        self.path = path

    def _set_metal_library_source(self, source):
        self.source = source


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
    assert "prebuilt" in loader._configure_metal(ext, from_source=False)
    assert ext.path == str(tmp_path / loader.METALLIB_NAME)


def test_jit_source_holds_every_kernel_and_compiles(tmp_path):
    ext = RecordingExt(__file__=str(tmp_path / "_ext.so"))
    assert "JIT" in loader._configure_metal(ext, from_source=True)
    assert ext.source.startswith("#define VLLM_METAL_PARTITION_SIZE 512\n")
    # MLX compiles the string as one file: it must compile on the harness as one file too.
    single = tmp_path / "all_kernels.metal"
    single.write_text(ext.source)
    library = MslLibrary(single, defines={}, cache_dir=REPO / "build" / "msl_harness")
    assert len(library.kernels) == 63 + 36 + 21 + 3


def test_staleness_check_drives_the_rebuild(monkeypatch, tmp_path):
    ext = get_ops()
    assert not loader._is_stale(ext)
    copy = tmp_path / "kernels_v2"
    shutil.copytree(REPO / "kernels_v2", copy)
    (copy / "reshape_and_cache.h").write_text("// changed\n")
    monkeypatch.setattr(kernel_sources, "kernels_dir", lambda *_: copy)
    assert loader._is_stale(ext)
    # The extension is imported here already: a rebuild could not take effect, so say so.
    monkeypatch.setattr(sys, "platform", "linux")
    with pytest.raises(ImportError, match="already imported"):
        loader._load_from_source()


def test_build_from_source_on_linux_recompiles_the_kernels_on_the_harness():
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
            "from vllm_metal.metal import get_ops\n"
            "print('hash', get_ops().kernels_hash)\n")
    env = dict(os.environ, VLLM_METAL_BUILD_FROM_SOURCE="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    result = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True,
                            timeout=600, cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "compiled on the MSL CPU harness (123 kernels)" in result.stdout + result.stderr
    assert "Native paged-attention CPU kernels loaded" in result.stdout + result.stderr
