"""The body of `POST /v1/messages` (Anthropic's Messages API), validated into a chat `JobSpec`.
A message runs on the same workers as a chat completion.

Content blocks become the chat roles the templates know. `system` becomes a system message. A
`system` message in `messages` becomes one where it is. The worker folds it into a user turn for
a template that renders no system message there. Each `tool_result` block of a user turn becomes
a tool message, before the turn's text. An assistant turn's `tool_use` blocks become its tool
calls. Earlier `thinking` and `redacted_thinking` blocks are accepted and left out of the prompt,
as templates drop past thinking. Consecutive turns of one role are joined, as Anthropic's API
joins them. `cache_control` is accepted anywhere Anthropic takes it: the worker's prefix cache
needs no marks. As for every endpoint, any field this server does not implement is a 400 naming
it. What each field it takes does, no-ops included, is in docs/requests.md.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

from pydantic import Discriminator, Field, Tag

from api.endpoints import images
from api.endpoints.body import MAX_TOOLS, Body, PositiveInt, StopString, TopP, template_kwargs
from api.endpoints.loosening import loosened
from api.endpoints.messages.blocks import (
    CacheControl,
    InputMessage,
    MediaBlock,
    SystemMessage,
    TextBlock,
    ToolReferenceBlock,
    ToolResultBlock,
    ToolUseBlock,
    block_type,
    image_url,
    is_image,
    readable,
    result_images,
    result_text,
)
from api.endpoints.messages.context import ContextManagement
from api.endpoints.structured import checked_choice, checked_format, checked_tools
from api.http.errors import APIError, invalid
from api.http.parsing import Strict, too_many, unsupported
from api.settings import Limits
from contract.jobspec import TOP_P, JobSpec, Message, ToolCall
from contract.keys import JobField
from contract.media import images as media
from contract.media.images import MARKER

# Anthropic's default
TEMPERATURE = 1.0


class ClientTool(Strict):
    """A client tool (`type` "custom" or left out). Anthropic's server tools are not run here."""

    type: Literal["custom"] | None = None
    name: str
    description: str | None = None
    input_schema: dict
    cache_control: CacheControl | None = None
    # true: every keyword of the schema enforced, or a 400
    strict: bool | None = None
    # arguments always stream as they are generated
    eager_input_streaming: bool | None = None
    # tool search's: rendered like the others, no context saved
    defer_loading: bool | None = None
    # shown in the description
    input_examples: Annotated[list[dict], Field(max_length=16)] | None = None

    def described(self) -> str:
        """The description the template renders, with the examples. It is the model's only way to see them."""
        examples = [json.dumps(e, ensure_ascii=False) for e in self.input_examples or ()]
        if not examples:
            return self.description or ""
        return "\n".join([self.description or "", "Examples of input:", *examples]).lstrip("\n")


class ToolSearchTool(Strict):
    """Anthropic's tool search (a server tool), left out of the prompt. Every tool, deferred or not,
    is rendered there, and none needs finding."""

    type: Literal[
        "tool_search_tool_regex_20251119",
        "tool_search_tool_regex",
        "tool_search_tool_bm25_20251119",
        "tool_search_tool_bm25",
    ]
    name: str
    cache_control: CacheControl | None = None
    defer_loading: bool | None = None
    strict: bool | None = None


def _tool_kind(value: object) -> str:
    return "search" if block_type(value).startswith("tool_search_tool_") else "client"


AnyTool = Annotated[
    Annotated[ClientTool, Tag("client")] | Annotated[ToolSearchTool, Tag("search")], Discriminator(_tool_kind)
]


class MessagesToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    def rules(self) -> dict[str, bool]:
        named = (self.type == "tool") == bool(self.name)
        return {"tool_choice.name: goes with type 'tool', and only with it": named}


class ThinkingConfig(Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    # Anthropic asks for at least 1,024; any positive budget is taken here (small models think briefly)
    budget_tokens: Annotated[int, Field(ge=1)] | None = None
    # omitted: signed blocks without text; updates: as summarized (no summaries are made here)
    display: Literal["summarized", "omitted", "updates"] | None = None

    def rules(self) -> dict[str, bool]:
        return {
            "thinking.budget_tokens: goes with type 'enabled', and is required there": (
                (self.type == "enabled") == (self.budget_tokens is not None)
            )
        }


class JSONFormat(Strict):
    type: Literal["json_schema"]
    schema_: Annotated[dict, Field(alias="schema")]


class OutputConfig(Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # the template's reasoning_effort
    format: JSONFormat | None = None  # structured output, as chat's json_schema


class MessagesMetadata(Strict):
    user_id: Annotated[str, Field(max_length=256)] | None = None


class MessagesRequest(Body):
    max_tokens: PositiveInt
    messages: Annotated[
        list[Annotated[InputMessage | SystemMessage, Field(discriminator="role")]], Field(min_length=1)
    ]
    system: str | list[TextBlock] | None = None
    stop_sequences: Annotated[list[StopString], Field(max_length=16)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    tools: Annotated[list[AnyTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: MessagesToolChoice | None = None
    thinking: ThinkingConfig | None = None
    context_management: ContextManagement | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl | None = None  # the prefix cache needs no marks
    metadata: MessagesMetadata | None = None  # type: ignore[assignment]
    service_tier: Literal["auto", "standard_only"] | None = None  # type: ignore[assignment]

    @property
    def priority(self) -> str:
        return "default"

    def to_spec(self, job_id: str, limits: Limits) -> JobSpec:
        self._read_images(limits)
        tools = self._tools()
        choice = self.tool_choice
        if choice is None or choice.type == "auto":
            tool_choice = checked_choice("auto" if tools else None, tools)
        elif choice.type == "tool":
            tool_choice = checked_choice(choice.name, tools, "tool_choice.name")
        else:
            tool_choice = checked_choice({"any": "required", "none": "none"}[choice.type], tools)
        messages = tuple(self._conversation())
        if self._images and media.problem(
            tuple(i.sha256 for i in self._images), (m.content for m in messages), "chat"
        ):
            raise invalid(
                f"Invalid 'messages': the text {MARKER!r} is reserved where images are sent.", "messages"
            )
        return JobSpec(
            id=job_id,
            kind="chat",
            model=self.model,
            messages=messages,
            images=tuple(image.sha256 for image in self._images),
            # Claude Code asks 32,000: above the server's limit, the limit (or the context) ends it
            max_tokens=None if self.max_tokens is None else min(self.max_tokens, limits.max_tokens),
            temperature=TEMPERATURE if self.temperature is None else float(self.temperature),
            top_p=TOP_P if self.top_p is None else float(self.top_p),
            top_k=self.top_k or 0,
            stop=tuple(self.stops()),
            response_format=self._format(),
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=not (choice and choice.disable_parallel_tool_use),
            priority=self.priority,
            template_kwargs=self._template_kwargs(),
            thinking_budget=(self.thinking.budget_tokens or 0) if self.thinking else 0,
            clear_tool_uses=self.context_management.clear_tool_uses() if self.context_management else None,
        )

    def _image_blocks(self) -> list[tuple[str, MediaBlock]]:
        """The user turns' image blocks, with where each is. They come in the order `_conversation`
        puts their markers. A turn's tool results (its tool messages) come first, then its own
        images (its user message)."""
        found = []
        for i, m in enumerate(self.messages):
            if not isinstance(m, InputMessage) or m.role != "user":
                continue
            blocks = list(enumerate(m.blocks()))
            found += [
                (f"messages[{i}].content[{j}].content[{k}]", part)
                for j, b in blocks
                if isinstance(b, ToolResultBlock)
                for k, part in result_images(b)
            ]
            found += [(f"messages[{i}].content[{j}]", b) for j, b in blocks if is_image(b)]
        return found

    def image_urls(self) -> list[tuple[str, str]]:
        return [image_url(b, at) for at, b in self._image_blocks()]

    def _read_images(self, limits: Limits) -> None:
        """The image blocks, each checked (api/endpoints/images.py), into `_images`."""
        for at, b in self._image_blocks():
            self._images.append(images.read(*image_url(b, at), limits, self._fetched))
            images.counted(self._images, at, limits)
            self._image_params.append(at)

    def _template_kwargs(self) -> dict:
        """`thinking` is the template's switch: Qwen3's and GLM's `enable_thinking`. Its budget
        is the worker's (worker/attempts/budget.py). `output_config.effort` is its effort."""
        kwargs = {"enable_thinking": self.thinking.type != "disabled"} if self.thinking else {}
        effort = self.output_config.effort if self.output_config else None
        return template_kwargs(effort, kwargs, "thinking")

    def _format(self) -> dict | None:
        fmt = self.output_config.format if self.output_config else None
        return checked_format("json_schema", fmt.schema_, "output_config.format.schema") if fmt else None

    def job_fields(self, job_id: str) -> dict[str, str]:
        """Thinking shown as signed blocks without their text is the Message's to say."""
        if self.thinking and self.thinking.display == "omitted":
            return {JobField.ECHO: json.dumps({"thinking_display": "omitted"})}
        return {}

    def _client_tools(self) -> list[ClientTool]:
        return [t for t in self.tools or () if isinstance(t, ClientTool)]

    def _tools(self):
        defs = []
        for t in self._client_tools():
            schema = t.input_schema if t.strict else loosened(t.input_schema)
            defs.append((t.name, t.described(), schema))
        at = [i for i, t in enumerate(self.tools or ()) if isinstance(t, ClientTool)]
        return checked_tools(defs, "tools[{}]", "input_schema", at)

    def _system(self) -> str | None:
        if self.system is None or isinstance(self.system, str):
            return self.system
        return "\n\n".join(_attribution(b.text) for b in self.system)

    def _conversation(self) -> list[Message]:
        """The turns as chat messages. Each tool result is checked against the calls of the
        assistant turn just before it (Anthropic's rule)."""
        system = self._system()
        out = [Message("system", system)] if system is not None else []
        turns = [m for m in self.messages if isinstance(m, InputMessage)]
        if not turns or turns[0].role != "user":
            raise invalid(
                "Invalid 'messages': the first message must be the user's (system messages aside).",
                "messages",
            )
        if turns[-1].role != "user":
            raise unsupported(
                "messages",
                "The last message must be the user's: continuing a final assistant message (a "
                "prefill) is not supported here.",
            )
        calls: set[str] = set()  # the tool_use ids of the last assistant turn
        last_user = max(i for i, m in enumerate(self.messages) if m.role == "user")
        for i, m in enumerate(self.messages):
            text: list[str] = []
            if isinstance(m, SystemMessage):
                for j, b in enumerate(m.blocks()):
                    readable(b, i, j)
                if m.clear_at != "next_user_message" or i > last_user:
                    out.append(Message("system", "\n\n".join(b.text for b in m.blocks())))
                continue
            if m.role == "assistant":
                made: list[ToolCall] = []
                for j, b in enumerate(m.blocks()):
                    readable(b, i, j)
                    if isinstance(b, TextBlock):
                        text.append(b.text)
                    elif isinstance(b, ToolUseBlock):
                        made.append(ToolCall(b.id, b.name, json.dumps(b.input, ensure_ascii=False)))
                    elif isinstance(b, ToolResultBlock):
                        raise _misplaced(b.type, "user", i, j)
                _join(out, Message("assistant", "".join(text), tool_calls=tuple(made)))
                calls = {c.id for c in made}
                continue
            for j, b in enumerate(m.blocks()):
                if is_image(b):  # its place in the user's text (contract/media/images.py)
                    text.append(MARKER)
                    continue
                readable(b, i, j)
                if isinstance(b, ToolResultBlock):
                    if b.tool_use_id not in calls:
                        raise invalid(
                            f"Invalid 'messages[{i}].content[{j}]': a tool_result block must answer a "
                            f"tool_use block of the assistant turn before it ({b.tool_use_id[:64]!r} "
                            "names none).",
                            f"messages[{i}].content[{j}].tool_use_id",
                        )
                    self._references(b, i, j)
                    out.append(Message("tool", result_text(b, i, j), tool_call_id=b.tool_use_id))
                elif isinstance(b, TextBlock):
                    text.append(b.text)
                else:  # tool_use and thinking are the assistant's
                    raise _misplaced(b.type, "assistant", i, j)
            calls = set()
            if text or not any(isinstance(b, ToolResultBlock) for b in m.blocks()):
                _join(out, Message("user", "".join(text)))
        return out

    def _references(self, block: ToolResultBlock, i: int, j: int) -> None:
        """A tool search's result names tools of the request (Anthropic's rule)."""
        names = {t.name for t in self._client_tools()}
        for part in block.content if isinstance(block.content, list) else ():
            if isinstance(part, ToolReferenceBlock) and part.tool_name not in names:
                raise invalid(
                    f"Invalid 'messages[{i}].content[{j}]': a tool_reference names no tool of the "
                    f"request ({part.tool_name[:64]!r}).",
                    f"messages[{i}].content[{j}]",
                )

    def stops(self) -> list[str]:
        return list(self.stop_sequences or ())

    def prompt_chars(self) -> tuple[int, str]:
        chars = len(self._system() or "")
        for m in self.messages:
            for b in m.blocks():
                if isinstance(b, TextBlock):
                    chars += len(b.text)
                elif isinstance(b, ToolUseBlock):
                    chars += len(b.name) + len(json.dumps(b.input))
                elif isinstance(b, ToolResultBlock):
                    chars += len(result_text(b, 0, 0, check=False))
        chars += sum(len(json.dumps(t.model_dump())) for t in self._client_tools())
        return chars, "messages"

    def wanted_tokens(self) -> tuple[int | None, str]:
        """None: a max_tokens above MAX_TOKENS_LIMIT is clamped to it (`to_spec`), not refused."""
        return None, "max_tokens"

    def enforce(self, limits: Limits) -> None:
        """MAX_MESSAGES counts the chat messages the turns become: each tool result is one."""
        turns = len(self.messages) + sum(
            isinstance(b, ToolResultBlock) for m in self.messages for b in m.blocks()
        )
        if turns > limits.max_messages:
            raise too_many("messages", limits.max_messages, turns)
        budget = self.thinking.budget_tokens if self.thinking else None
        if budget is not None and self.max_tokens is not None and budget >= self.max_tokens:
            raise invalid(
                "Invalid 'thinking.budget_tokens': it must be less than max_tokens.", "thinking.budget_tokens"
            )
        super().enforce(limits)


_BILLING = "x-anthropic-billing-header:"
_CCH = re.compile(r"\bcch=[^;\s]*")


def _attribution(text: str) -> str:
    """Claude Code's first system block, with its `cch` made one constant, as the llama.cpp server
    does. The block is `x-anthropic-billing-header: cc_version=...; cch=<a new value each request>`.
    Otherwise no two requests share a prompt prefix, and no cache is ever read."""
    return _CCH.sub("cch=00000", text) if text.startswith(_BILLING) else text


def _misplaced(kind: str, role: str, i: int, j: int) -> APIError:
    return invalid(f"Invalid 'messages[{i}].content[{j}]': {kind} blocks go in {role} turns.", "messages")


def _join(out: list[Message], message: Message) -> None:
    """Add a turn; one after a turn of the same role joins it."""
    last = out[-1] if out else None
    if last is None or last.role != message.role or message.role not in ("user", "assistant"):
        out.append(message)
        return
    content = "\n\n".join(t for t in (last.content, message.content) if t)
    out[-1] = Message(last.role, content, tool_calls=last.tool_calls + message.tool_calls)
