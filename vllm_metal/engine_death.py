"""vLLM general plugin: `vllm serve` exits non-zero when its engine died.

vLLM 0.33's API server, when its engine core process dies, answers 503 for a few
seconds and then shuts down with exit status 0, so a supervisor that restarts on
failure (launchd's KeepAlive on a crash, systemd's Restart=on-failure) never restarts
it. vLLM decides to shut down in one function, `terminate_if_errored` (called by its
watchdog and its engine-error handler); we note when it does, and turn the process's
exit status into 1 at exit. A server stopped by a signal still exits as before.

Before that exit, no process the server started outlives it: vLLM's own shutdown
gives its engine core a grace period and then kills its process tree, but a rank that
was blocked in a collective when its peer died, or any process still tearing down,
could otherwise be orphaned. Those left after a short wait are killed.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys

logger = logging.getLogger("vllm_metal")

EXIT_STATUS = 1
_MARK = "_vllm_metal_engine_death"
_died = False
# Seconds the server's remaining descendants get to exit before they are killed.
_GRACE = 3.0

# Modules that hold vLLM's terminate_if_errored by name.
_HOLDERS = ("vllm.entrypoints.launchers.launcher",
            "vllm.entrypoints.serve.exception_handling.handlers.vllm_error")


def register() -> None:
    """Entry point of ``vllm.general_plugins``; idempotent."""
    import importlib

    watched = False
    for name in _HOLDERS:
        try:
            module = importlib.import_module(name)
        except ImportError:  # another vLLM layout: nothing to watch
            continue
        original = getattr(module, "terminate_if_errored", None)
        if original is None:
            continue
        if not getattr(original, _MARK, False):
            module.terminate_if_errored = _watching(original)
        watched = True
    if watched and not getattr(register, _MARK, False):
        # Registered while vLLM starts, so it runs after the exit handlers vLLM registers
        # later (atexit runs them last-in, first-out): its cleanup is done first.
        atexit.register(_exit_failed_if_died)
        setattr(register, _MARK, True)


def _watching(original):
    def terminate_if_errored(server, engine):
        original(server, engine)
        if getattr(server, "should_exit", False) and engine.errored and not engine.is_running:
            _note_death()

    setattr(terminate_if_errored, _MARK, True)
    terminate_if_errored.__doc__ = original.__doc__
    return terminate_if_errored


def _note_death() -> None:
    global _died
    if not _died:
        _died = True
        logger.error("The engine died; the server will exit with status %d so a supervisor "
                     "restarts it", EXIT_STATUS)


def _exit_failed_if_died() -> None:
    if _died:
        _reap_descendants(_GRACE)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_STATUS)


def _reap_descendants(grace: float) -> None:
    """Wait up to `grace` seconds for this process's descendants, then SIGKILL the rest.

    multiprocessing's resource tracker is spared: it exits when this process does,
    after unlinking what it tracks (killing it would leak shared memory)."""
    import psutil

    try:
        children = [child for child in psutil.Process().children(recursive=True)
                    if not _is_resource_tracker(child)]
        _, alive = psutil.wait_procs(children, timeout=grace)
    except psutil.Error:
        return
    for child in alive:
        try:
            logger.error("Process %d (%s) outlived the engine; killing it", child.pid,
                         child.name())
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)


def _is_resource_tracker(process) -> bool:
    try:
        return any("resource_tracker" in part for part in process.cmdline())
    except Exception:  # gone, or not ours to read: nothing to spare
        return False
