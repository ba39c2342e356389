"""The kernels_v2/ Metal sources: where they are, their hash stamp, which of them
use Metal 4's tensor ops, and the one-file JIT sources of the two libraries.

The stamp recipe matches csrc/cmake/kernels_v2.cmake: sha256 over
"name\\nsha256(content)\\n" of the sorted *.h and *.metal files.

Also a script, for the CMake build (which needs no vllm_metal import for it):
``python kernel_sources.py tensor-op-files DIR`` prints the names of DIR's
tensor-op .metal files, one a line.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

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
    from vllm_metal.native import constants  # here: the script mode runs without the package

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


def tensor_op_files(directory: Path) -> list[Path]:
    """The .metal files of `directory` that use Metal 4's tensor ops: the tensor-op
    library's (the main library, Metal 3.1, holds all the others)."""
    return [p for p in kernel_files(directory) if p.suffix == ".metal" and uses_tensor_ops(p)]


def metal_source(directory: Path, tensor_ops: bool = False) -> str:
    """The .metal files of one library as one source: the main library's (every
    file but the tensor-op ones) or, with `tensor_ops`, the tensor-op library's
    ("" when there are none); the constants as #defines, local headers inlined
    once each (MLX compiles a single string). The two stay apart so that a compile
    error in a tensor-op file, which no Mac has compiled yet, costs only the
    NaxPrefill route, not every kernel."""
    seen: set[str] = set()

    def expand(path: Path) -> str:
        def include(m: re.Match) -> str:
            name = m.group(1)
            if name in seen:
                return ""
            seen.add(name)
            return expand(directory / name)

        return _LOCAL_INCLUDE.sub(include, path.read_text()).replace("#pragma once", "")

    tensor = set(tensor_op_files(directory))
    files = [p for p in kernel_files(directory) if p.suffix == ".metal" and (p in tensor) == tensor_ops]
    if not files:
        return ""
    defines = "".join(f"#define {k} {v}\n" for k, v in constant_defines().items())
    return defines + "\n".join(expand(p) for p in files)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "tensor-op-files":
        sys.exit("usage: kernel_sources.py tensor-op-files DIR")
    print("\n".join(p.name for p in tensor_op_files(Path(sys.argv[2]))))
