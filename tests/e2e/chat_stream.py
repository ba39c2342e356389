"""A chat completion's message, the same shape whether it came whole or streamed.

`message(resp)` and `streamed_message(chunks)` both give
``{"content": str, "reasoning": str, "tool_calls": [(name, arguments)],
"finish_reason": str}`` (missing parts as "" or []), so a test compares a
streamed answer with the non-streamed one by ==. Tool call ids are left out:
vLLM draws a fresh one per response.
"""

from __future__ import annotations


def message(resp) -> dict:
    """From an openai ChatCompletion."""
    choice = resp.choices[0]
    msg = choice.message
    return {
        "content": msg.content or "",
        "reasoning": getattr(msg, "reasoning", None) or "",
        "tool_calls": [(c.function.name, c.function.arguments) for c in msg.tool_calls or ()],
        "finish_reason": choice.finish_reason,
    }


def streamed_message(chunks) -> dict:
    """From an openai chat completion stream: deltas joined, tool call arguments joined
    per call index."""
    content, reasoning, finish = [], [], None
    calls: dict[int, list] = {}
    for chunk in chunks:
        if not chunk.choices:
            continue  # the usage chunk
        choice = chunk.choices[0]
        delta = choice.delta
        content.append(delta.content or "")
        reasoning.append(getattr(delta, "reasoning", None) or "")
        for call in delta.tool_calls or ():
            name, args = calls.setdefault(call.index, ["", []])
            if call.function and call.function.name:
                calls[call.index][0] = name + call.function.name
            if call.function and call.function.arguments:
                args.append(call.function.arguments)
        finish = choice.finish_reason or finish
    return {
        "content": "".join(content),
        "reasoning": "".join(reasoning),
        "tool_calls": [(name, "".join(args)) for _, (name, args) in sorted(calls.items())],
        "finish_reason": finish,
    }
