"""Defaults of vLLM's engine arguments that differ on this platform.

Only arguments the user left unset are changed, and the change is logged with the
flag that overrides it. Installed by the platform before vLLM builds its config.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm_metal")

_installed = False


def install() -> None:
    """Idempotent: wrap vLLM's choice of the prefix-caching default."""
    global _installed
    if _installed:
        return
    _installed = True
    from vllm.engine.arg_utils import EngineArgs

    choose = EngineArgs._set_default_chunked_prefill_and_prefix_caching_args

    def choose_for_metal(self, model_config):
        # A hybrid's prefix cache (vLLM's "align" mode) keeps a recurrent state per
        # cached block: a state-sized copy each time a request crosses a block, and
        # prompt chunks cut at block boundaries. Worth it for repeated prefixes only,
        # so it is the user's call.
        if self.enable_prefix_caching is None and model_config.is_hybrid:
            self.enable_prefix_caching = False
            logger.info("Prefix caching is off for hybrid models (%s) unless "
                        "--enable-prefix-caching is given", model_config.architecture)
        return choose(self, model_config)

    EngineArgs._set_default_chunked_prefill_and_prefix_caching_args = choose_for_metal
