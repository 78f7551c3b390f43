"""Every field the official SDKs' request types have, one level into messages, content parts
and tools, is decided: implemented, accepted as a documented no-op, or refused for a reason,
in docs/requests.md's table ("Every field the SDKs send"). The request models must agree with
the table, and an SDK upgrade that brings a field nobody has decided about fails here (the
SDKs are pinned in pyproject.toml)."""

from __future__ import annotations

import re
from pathlib import Path

import anthropic.types as at
import pytest
from anthropic.types import message_count_tokens_params, message_create_params
from openai.types import batch_create_params, embedding_create_params, shared_params
from openai.types import chat as oc
from openai.types import completion_create_params as legacy
from openai.types import responses as R
from openai.types.chat import completion_create_params as chat
from openai.types.responses import response_create_params as responses
from openai.types.responses import response_input_item_param as items
from pydantic import BaseModel

from api.batches.routes import BatchRequest
from api.endpoints import body
from api.endpoints.chat import body as cb
from api.endpoints.completions.body import CompletionRequest
from api.endpoints.embeddings.body import EmbeddingRequest
from api.endpoints.messages import blocks as mbl
from api.endpoints.messages import body as mb
from api.endpoints.messages.routes import CountRequest
from api.endpoints.responses import body as rb
from api.endpoints.responses import input as ri
from api.endpoints.responses import offered, tools

DOC = Path(__file__).parents[4] / "docs" / "requests.md"

# (where, the SDK's type, the model that reads it here)
SURFACES: list[tuple[str, type, type[BaseModel]]] = [
    ("chat", chat.CompletionCreateParamsBase, cb.ChatRequest),
    ("chat.messages[system]", oc.ChatCompletionSystemMessageParam, cb.SystemMessage),
    ("chat.messages[developer]", oc.ChatCompletionDeveloperMessageParam, cb.SystemMessage),
    ("chat.messages[user]", oc.ChatCompletionUserMessageParam, cb.UserMessage),
    ("chat.messages[assistant]", oc.ChatCompletionAssistantMessageParam, cb.AssistantMessage),
    ("chat.messages[tool]", oc.ChatCompletionToolMessageParam, cb.ToolMessage),
    ("chat content part (text)", oc.ChatCompletionContentPartTextParam, cb.TextPart),
    ("chat content part (image)", oc.ChatCompletionContentPartImageParam, cb.ImagePart),
    ("chat.tools[]", oc.ChatCompletionFunctionToolParam, cb.ToolDef),
    ("chat.tools[].function", shared_params.FunctionDefinition, body.FunctionDef),
    ("chat tool call", oc.ChatCompletionMessageFunctionToolCallParam, cb.ToolCallIn),
    ("chat.stream_options", oc.ChatCompletionStreamOptionsParam, cb.StreamOptions),
    ("completions", legacy.CompletionCreateParamsBase, CompletionRequest),
    ("embeddings", embedding_create_params.EmbeddingCreateParams, EmbeddingRequest),
    ("batches", batch_create_params.BatchCreateParams, BatchRequest),
    ("responses", responses.ResponseCreateParamsBase, rb.ResponsesRequest),
    ("responses.input[message]", R.EasyInputMessageParam, ri.MessageItem),
    ("responses.input[function_call]", R.ResponseFunctionToolCallParam, ri.FunctionCallItem),
    ("responses.input[function_call_output]", items.FunctionCallOutput, ri.FunctionCallOutputItem),
    ("responses.input[custom_tool_call]", R.ResponseCustomToolCallParam, ri.CustomToolCallItem),
    (
        "responses.input[custom_tool_call_output]",
        R.ResponseCustomToolCallOutputParam,
        ri.CustomToolCallOutputItem,
    ),
    ("responses.input[reasoning]", R.ResponseReasoningItemParam, rb.ReasoningItem),
    ("responses.input[item_reference]", items.ItemReference, ri.ItemReference),
    ("responses input_text part", R.ResponseInputTextParam, ri.InputText),
    ("responses input_image part", R.ResponseInputImageParam, ri.InputImage),
    ("responses.tools[function]", R.FunctionToolParam, offered.FunctionTool),
    ("responses.tools[custom]", R.CustomToolParam, tools.CustomTool),
    ("responses.tools[namespace]", R.NamespaceToolParam, offered.NamespaceTool),
    ("responses.text", R.ResponseTextConfigParam, rb.TextConfig),
    ("responses.reasoning", shared_params.Reasoning, rb.Reasoning),
    ("responses.stream_options", responses.StreamOptions, rb.ResponsesStreamOptions),
    ("messages", message_create_params.MessageCreateParamsBase, mb.MessagesRequest),
    ("messages count_tokens", message_count_tokens_params.MessageCountTokensParams, CountRequest),
    ("messages.messages[user]", at.UserMessageParam, mbl.InputMessage),
    ("messages.messages[assistant]", at.AssistantMessageParam, mbl.InputMessage),
    ("messages.messages[system]", at.SystemMessageParam, mbl.SystemMessage),
    ("messages text block", at.TextBlockParam, mbl.TextBlock),
    ("messages tool_use block", at.ToolUseBlockParam, mbl.ToolUseBlock),
    ("messages tool_result block", at.ToolResultBlockParam, mbl.ToolResultBlock),
    ("messages thinking block", at.ThinkingBlockParam, mbl.ThinkingBlock),
    ("messages redacted_thinking block", at.RedactedThinkingBlockParam, mbl.RedactedThinkingBlock),
    ("messages.tools[]", at.ToolParam, mb.ClientTool),
    ("messages.thinking", at.ThinkingConfigEnabledParam, mb.ThinkingConfig),
    ("messages.metadata", at.MetadataParam, mb.MessagesMetadata),
]
_ROW = re.compile(r"^\| (?P<where>[^|`]+?) \| `(?P<field>[a-z_]+)` \| (?P<verdict>implemented|no-op|refused)")


def decided() -> dict[tuple[str, str], str]:
    """(where, field) -> its verdict, from the table in docs/requests.md."""
    rows = [m for line in DOC.read_text().splitlines() if (m := _ROW.match(line))]
    return {(m["where"], m["field"]): m["verdict"] for m in rows}


def sdk_fields(typed: type) -> set[str]:
    return set(typed.__annotations__)


def taken(model: type[BaseModel]) -> set[str]:
    """The fields a request model takes (by the name a client sends); any other is a 400."""
    return {field.alias or name for name, field in model.model_fields.items()}


@pytest.mark.parametrize(("where", "typed", "model"), SURFACES, ids=[s[0] for s in SURFACES])
def test_every_sdk_field_is_decided_and_the_model_agrees(where, typed, model):
    table = decided()
    undecided = sorted(f for f in sdk_fields(typed) if (where, f) not in table)
    assert not undecided, f"{where}: no row in docs/requests.md for {undecided}"
    for field in sdk_fields(typed):
        verdict = table[(where, field)]
        assert (field in taken(model)) == (verdict != "refused"), f"{where}.{field}: the table says {verdict}"


def test_the_table_names_no_field_the_sdks_lack():
    known = {(where, f) for where, typed, _ in SURFACES for f in sdk_fields(typed)}
    stale = sorted(set(decided()) - known)
    assert not stale, f"rows for fields the SDKs no longer have: {stale}"
