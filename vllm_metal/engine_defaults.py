"""Defaults of vLLM's engine arguments that differ on this platform.

Only arguments the user left unset are changed, and the change is logged with the
flag that overrides it. Installed by the platform before vLLM builds its config.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm_metal")

_installed = False


def install() -> None:
    """Idempotent: wrap vLLM's choice of the prefix-caching default (and, with
    speculative decoding, of asynchronous scheduling); the model config it is given
    becomes this platform's (distributed/model_config.py)."""
    global _installed
    if _installed:
        return
    _installed = True
    from vllm.engine.arg_utils import EngineArgs

    choose = EngineArgs._set_default_chunked_prefill_and_prefix_caching_args

    def choose_for_metal(self, model_config):
        from vllm_metal.distributed.model_config import adopt

        adopt(model_config)
        # A hybrid's prefix cache (vLLM's "align" mode) keeps a recurrent state per
        # cached block: a state-sized copy each time a request crosses a block, and
        # prompt chunks cut at block boundaries. Worth it for repeated prefixes only,
        # so it is the user's call.
        if self.enable_prefix_caching is None and model_config.is_hybrid:
            self.enable_prefix_caching = False
            logger.info("Prefix caching is off for hybrid models (%s) unless "
                        "--enable-prefix-caching is given", model_config.architecture)
        method = (self.speculative_config or {}).get("method")
        if method is not None:
            # Before vLLM builds the method's config, which for some methods wants
            # packages (or checkpoints) that would fail first with their own message.
            from vllm_metal.spec_decode.support import check_method

            check_method(method)
        if self.speculative_config is not None:
            from vllm_metal.spec_decode.support import check_scheduling

            # The runner proposes drafts from the tokens a step accepted, which
            # asynchronous scheduling would hand it one step late.
            check_scheduling(self.async_scheduling)
            if self.async_scheduling is None:
                self.async_scheduling = False
                logger.info("Asynchronous scheduling is off with --speculative-config")
        return choose(self, model_config)

    EngineArgs._set_default_chunked_prefill_and_prefix_caching_args = choose_for_metal
