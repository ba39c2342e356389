"""Speculative decoding: drafts proposed after a step, verified in the next packed step.

vLLM's scheduler schedules each request's draft tokens as extra query rows; the runner
verifies them in its packed forward (support.py: which configurations run,
rejection.py: the acceptance rule, drafters.py: where drafts come from).
"""
