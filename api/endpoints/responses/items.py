"""The items of a Responses conversation, as stored and as chat messages.

The items are messages, function and custom tool calls, and their outputs. They are stored
with a response. A worker's template renders them as chat messages. A custom call is a
function call whose arguments are `{"input": ...}` (contract/freeform/).

Input items are stored as openai-python's `ResponseItem` types have them, each with an id. The
id is the client's own, or one made from the response's id and the item's place. So an
`item_reference` to it can be found again, as the AI SDK sends for earlier turns. Output items
carry ids of the same form (api/endpoints/responses/objects.py: `item_id`).

A reasoning item is the thinking of the assistant turn that follows it (its message or its
calls). It becomes the chat message's `reasoning`, which the model's template renders or not.
A call to a namespaced function is the call of its flattened name
(api/endpoints/responses/offered.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from api.endpoints.responses.objects import ID_PREFIX
from api.endpoints.responses.offered import flat_name
from contract.freeform.calls import arguments_json
from contract.jobspec import Message, ToolCall
from contract.media.images import MARKER

_REFERENCE = re.compile(r"(msg|fc|fco|ctc|ctco|rs)_([A-Za-z0-9]{1,64})_(in)?(\d{1,6})")


@dataclass(frozen=True)
class Reference:
    """Where an item id points: output item `index` of a response, or input item `index`."""

    response_id: str
    index: int
    input: bool


def parse_reference(item_id: str) -> Reference | None:
    m = _REFERENCE.fullmatch(item_id)
    if m is None:
        return None
    return Reference(ID_PREFIX + m[2], int(m[4]), bool(m[3]))


def input_id(response_id: str, kind: str, index: int) -> str:
    return f"{kind}_{response_id.removeprefix(ID_PREFIX)}_in{index}"


def message_item(item_id: str, role: str, text: str, parts: list[dict] | None = None) -> dict:
    """A stored message: an assistant's is an output message, anyone else's an input one. `parts` is
    a user's content with its images, as `ResponseInputImage`s."""
    if parts is not None:
        return {"id": item_id, "type": "message", "role": role, "status": "completed", "content": parts}
    if role == "assistant":
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    else:
        part = {"type": "input_text", "text": text}
    return {"id": item_id, "type": "message", "role": role, "status": "completed", "content": [part]}


def call_item(item_id: str, call_id: str, name: str, arguments: str, namespace: str | None = None) -> dict:
    item = {
        "id": item_id,
        "type": "function_call",
        "status": "completed",
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
    }
    return item | {"namespace": namespace} if namespace else item


def reasoning_item(item_id: str, text: str) -> dict:
    """Thinking sent back (opened, where it was sealed), as a response's output holds it."""
    part = {"type": "reasoning_text", "text": text}
    return {"id": item_id, "type": "reasoning", "summary": [], "status": "completed", "content": [part]}


def custom_call_item(item_id: str, call_id: str, name: str, text: str) -> dict:
    return {
        "id": item_id,
        "type": "custom_tool_call",
        "status": "completed",
        "call_id": call_id,
        "name": name,
        "input": text,
    }


def output_item(item_id: str, call_id: str, output: str, kind: str = "function_call_output") -> dict:
    return {
        "id": item_id,
        "type": kind,
        "status": "completed",
        "call_id": call_id,
        "output": output,
    }


def item_text(item: dict) -> str:
    """The item's text, each image its marker (contract/media/images.py)."""
    return "".join(
        MARKER if part.get("type") == "input_image" else part.get("text", "")
        for part in item.get("content", ())
    )


def has_images(item: dict) -> bool:
    return item.get("type") == "message" and any(p.get("type") == "input_image" for p in item["content"])


def item_chars(item: dict) -> int:
    """The characters of prompt a stored item adds to a conversation. A message or a reasoning item
    adds its text. A call adds its name and arguments, a call output its text."""
    kind = item.get("type")
    if kind == "function_call":
        return len(item.get("name", "")) + len(item.get("namespace") or "") + len(item.get("arguments", ""))
    if kind == "custom_tool_call":
        return len(item.get("name", "")) + len(item.get("input", ""))
    if kind in ("function_call_output", "custom_tool_call_output"):
        return len(item.get("output", ""))
    return len(item_text(item))


def message_chars(m: Message) -> int:
    """The same for a chat message: its text, its thinking and its calls' arguments."""
    return len(m.content) + len(m.reasoning) + sum(len(c.arguments) for c in m.tool_calls)


def to_messages(items: list[dict]) -> list[Message]:
    """Stored items as chat messages. An assistant's thinking, its text and the calls that follow it
    are one assistant message. A call's output is a tool message."""
    out: list[Message] = []
    # a reasoning item's, for the assistant turn after it
    thought: str | None = None
    for item in items:
        kind = item["type"]
        if kind == "reasoning":
            thought = (thought or "") + item_text(item)
            continue
        if kind == "message" and item["role"] == "assistant":
            out.append(Message("assistant", item_text(item), reasoning=thought or ""))
        elif kind in ("function_call", "custom_tool_call"):
            name = flat_name(item["namespace"], item["name"]) if item.get("namespace") else item["name"]
            arguments = item["arguments"] if kind == "function_call" else arguments_json(item["input"])
            call = ToolCall(item["call_id"], name, arguments)
            last = out[-1] if out else None
            if thought is None and last is not None and last.role == "assistant":
                out[-1] = replace(last, tool_calls=(*last.tool_calls, call))
            else:
                out.append(Message("assistant", "", (call,), reasoning=thought or ""))
        else:
            # thinking that led to nothing the model said
            if thought is not None:
                out.append(Message("assistant", "", reasoning=thought))
            if kind == "message":
                role = "system" if item["role"] == "developer" else item["role"]
                out.append(Message(role=role, content=item_text(item)))
            elif kind in ("function_call_output", "custom_tool_call_output"):
                out.append(Message("tool", item["output"], tool_call_id=item["call_id"]))
        thought = None
    if thought is not None:
        out.append(Message("assistant", "", reasoning=thought))
    return out
