"""vllm_metal.compat's patches: vLLM's per-clip warning that torchcodec is missing is
logged once per process, other records of that logger pass."""

from __future__ import annotations

import logging

from vllm_metal import compat


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_the_audio_backend_warning_is_logged_once():
    compat.apply_all()
    log = logging.getLogger("vllm.multimodal.media.audio")
    count = _Count()
    log.addHandler(count)
    try:
        for _ in range(3):
            log.warning("torchcodec unavailable (%r); falling back to soundfile/PyAV.", "x")
            log.warning("another message")
    finally:
        log.removeHandler(count)
    assert sum(m.startswith("torchcodec unavailable") for m in count.messages) <= 1
    assert count.messages.count("another message") == 3
