"""The kernels_v2/ Metal sources: where they are, their hash stamp, one-file JIT source.

The stamp recipe matches csrc/cmake/kernels_v2.cmake: sha256 over
"name\\nsha256(content)\\n" of the sorted *.h and *.metal files.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from vllm_metal.native import constants

PACKAGE_DIR = Path(__file__).resolve().parents[1]


def source_tree() -> Path | None:
    """The repository root when running from a source checkout (editable install), else None."""
    root = PACKAGE_DIR.parent
    return root if (root / "csrc").is_dir() and (root / "kernels_v2").is_dir() else None


def kernels_dir(extension_dir: Path | None = None) -> Path | None:
    """kernels_v2/ of the source tree, else the copy installed next to the extension."""
    root = source_tree()
    if root is not None:
        return root / "kernels_v2"
    installed = (extension_dir or PACKAGE_DIR) / "kernels_v2"
    return installed if installed.is_dir() else None


def kernel_files(directory: Path) -> list[Path]:
    return sorted((p for p in directory.iterdir() if p.suffix in (".h", ".metal")), key=lambda p: p.name)


def kernels_hash(directory: Path) -> str:
    stamp = "".join(f"{p.name}\n{hashlib.sha256(p.read_bytes()).hexdigest()}\n" for p in kernel_files(directory))
    return hashlib.sha256(stamp.encode()).hexdigest()


def constant_defines() -> dict[str, str]:
    """The macros every kernel build gets (the same CMake passes)."""
    return {
        "VLLM_METAL_PARTITION_SIZE": str(constants.PARTITION_SIZE),
        "VLLM_METAL_KERNEL_BLOCK_SIZES": ",".join(str(b) for b in constants.KERNEL_BLOCK_SIZES),
    }


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def uses_tensor_ops(path: Path, seen: set[Path] | None = None) -> bool:
    """Whether a .metal file, or a local header it includes, includes Metal 4's
    tensor ops (MetalPerformancePrimitives)."""
    seen = set() if seen is None else seen
    path = Path(path).resolve()
    if path in seen or not path.exists():
        return False
    seen.add(path)
    text = path.read_text()
    if re.search(r"#\s*include\s*<MetalPerformancePrimitives/", text):
        return True
    return any(uses_tensor_ops(path.parent / name, seen) for name in _LOCAL_INCLUDE.findall(text))


def metal_source(directory: Path) -> str:
    """Every .metal file of `directory` as one source: the constants as #defines,
    local headers inlined once each (MLX compiles a single string). Files using
    Metal 4's tensor ops (the NaxPrefill kernels) are left out: no Mac has compiled
    them yet, and one compile error in a single-string library would take every
    other kernel down with it (they need a library of their own)."""
    seen: set[str] = set()

    def expand(path: Path) -> str:
        def include(m: re.Match) -> str:
            name = m.group(1)
            if name in seen:
                return ""
            seen.add(name)
            return expand(directory / name)

        return _LOCAL_INCLUDE.sub(include, path.read_text()).replace("#pragma once", "")

    defines = "".join(f"#define {k} {v}\n" for k, v in constant_defines().items())
    files = [p for p in kernel_files(directory) if p.suffix == ".metal" and not uses_tensor_ops(p)]
    return defines + "\n".join(expand(p) for p in files)
