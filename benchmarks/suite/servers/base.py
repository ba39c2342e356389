"""What the suite needs from a server under test: install it, then say how to launch it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ModelFiles:
    """One model in the forms the servers take: the GGUF, its HF tokenizer dir, an MLX 4-bit dir."""

    gguf: Path
    tokenizer_dir: Path
    mlx_dir: Path | None = None   # made only when an MLX peer is selected


@dataclass
class Launch:
    """How to start a server and how the bench client must talk to it."""

    argv: list[str]
    model_name: str                     # the "model" field every request carries
    env: dict[str, str] = field(default_factory=dict)   # added to the inherited environment
    extra_body: dict | None = None      # merged into every request body by the client
    health_path: str = "/health"
    cwd: Path | None = None


class Server:
    """A server under test. Subclasses set the class attributes and implement the verbs."""

    name: str = ""            # the --servers key
    label: str = ""           # the table's description
    needs_mlx_model: bool = False
    startup_timeout: float = 600.0

    def __init__(self, cache_root: Path) -> None:
        self.root = cache_root / self.name
        self.log = cache_root / "logs" / f"install-{self.name}.log"

    def install(self) -> None:
        """Make the server runnable (idempotent, cached under self.root)."""

    def launch(self, models: ModelFiles, port: int) -> Launch:
        raise NotImplementedError

    def after_stop(self) -> None:
        """Clean state a server leaves behind that would leak into the next run."""
