"""Where drafts come from: after a step, each request that sampled gets up to k drafts,
which vLLM's scheduler schedules into the next step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from vllm_metal.v1.input_batch import InputBatch


class Drafter(Protocol):
    def propose(self, batch: InputBatch, req_ids: list[str]) -> list[list[int]]:
        """Up to k drafts for each of ``req_ids`` (rows of ``batch`` holding every
        token they have so far); [] where there is none."""


class NgramDrafter:
    """Prompt lookup by vLLM's own proposer: the tokens that followed the longest
    earlier match (prompt_lookup_min..max tokens) of the sequence's end."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        self.k = vllm_config.speculative_config.num_speculative_tokens
        self._proposer = NgramProposer(vllm_config)  # compiles its matcher once

    def propose(self, batch: InputBatch, req_ids: list[str]) -> list[list[int]]:
        # The proposer reads rows of a [rows, max_model_len] token array by index:
        # it is given the batch's own array, and an empty entry for rows not asked.
        wanted = [[] for _ in range(batch.max_num_reqs)]
        rows = [batch.row_of.get(r) for r in req_ids]
        for row in rows:
            if row is not None:
                wanted[row] = [0]
        drafts = self._proposer.propose(self.k, wanted, batch.num_tokens, batch.token_ids)
        return [list(map(int, drafts[row])) if row is not None else [] for row in rows]


def make_drafter(vllm_config: VllmConfig) -> Drafter | None:
    spec = vllm_config.speculative_config
    if spec is None:
        return None
    if spec.method == "ngram":
        return NgramDrafter(vllm_config)
    raise ValueError(f"--speculative-config method {spec.method!r} has no drafter")
