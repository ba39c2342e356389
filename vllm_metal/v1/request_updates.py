"""Apply a SchedulerOutput's request bookkeeping to the persistent batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_metal.v1.input_batch import InputBatch, RequestState

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

    from vllm_metal.v1.prompt_logprobs import PromptLogprobsTracker


def apply_scheduler_output(batch: InputBatch, out: SchedulerOutput,
                           prompt_logprobs: PromptLogprobsTracker,
                           takes_sampled: bool = False) -> None:
    """Finished requests leave; new ones arrive; running ones get blocks, counts and
    the drafts their query verifies. ``takes_sampled``: this runner samples nothing
    (a pipeline stage before the last), and running requests' new tokens are the
    ones vLLM sends (``new_token_ids``)."""
    for req_id in out.finished_req_ids:
        batch.remove_request(req_id)
        prompt_logprobs.remove_request(req_id)

    for req_id in out.preempted_req_ids or ():
        batch.reset_row(req_id)  # its blocks are gone; the row is rebuilt on resume

    for new in out.scheduled_new_reqs:
        if new.prompt_token_ids is None:
            raise ValueError(f"request {new.req_id}: prompt embeddings are not supported")
        state = RequestState(
            req_id=new.req_id,
            prompt_token_ids=list(new.prompt_token_ids),
            sampling_params=new.sampling_params,
            block_ids=[list(group) for group in new.block_ids],
            num_computed_tokens=new.num_computed_tokens,
            lora_request=new.lora_request,
            pooling_params=new.pooling_params,
        )
        batch.reset_row(new.req_id)
        batch.add_request(state)
        prompt_logprobs.add_request(state)

    cached = out.scheduled_cached_reqs
    if takes_sampled and len(cached.new_token_ids) != len(cached.req_ids):
        # vLLM leaves them out under async scheduling, which it turns off for pipeline
        # parallel; without them this stage would run stale tokens.
        raise RuntimeError("a pipeline stage needs the sampled tokens vLLM sends with each "
                           "step (new_token_ids); run without --async-scheduling")
    for i, req_id in enumerate(cached.req_ids):
        state = batch.requests[req_id]
        state.num_computed_tokens = cached.num_computed_tokens[i]
        new_blocks = cached.new_block_ids[i]
        if req_id in cached.resumed_req_ids:
            # Preempted and back: new blocks replace the old, tokens are recomputed.
            _restore_outputs(state, cached.num_output_tokens[i],
                             cached.all_token_ids.get(req_id))
            state.block_ids = ([list(group) for group in new_blocks] if new_blocks
                               else [[] for _ in state.block_ids])
            batch.reset_row(req_id)
            continue
        num_outputs = cached.num_output_tokens[i]
        if num_outputs < len(state.output_token_ids):
            # The scheduler dropped tokens we sampled (e.g. past a stop): follow it.
            del state.output_token_ids[num_outputs:]
            batch.reset_row(req_id)
        if new_blocks:
            batch.append_blocks(req_id, new_blocks)
        if takes_sampled:
            _take_sampled(batch, state, cached.new_token_ids[i])

    batch.apply_schedule(out)
    for req_id, drafts in out.scheduled_spec_decode_tokens.items():
        batch.set_drafts(req_id, drafts)


def _restore_outputs(state: RequestState, num_outputs: int,
                     all_token_ids: list[int] | None) -> None:
    if all_token_ids is not None and num_outputs > 0:
        state.output_token_ids = list(all_token_ids[-num_outputs:])
    else:
        del state.output_token_ids[num_outputs:]


def _take_sampled(batch: InputBatch, state: RequestState, scheduled: list[int]) -> None:
    """``scheduled``: the request's tokens from num_computed_tokens on, as vLLM's
    scheduler sends them under pipeline parallelism; the ones past what the request
    holds are the tokens the last stage sampled."""
    new = state.num_computed_tokens + len(scheduled) - state.num_tokens
    for token in scheduled[len(scheduled) - new:] if new > 0 else ():
        batch.append_token(state.req_id, token)
