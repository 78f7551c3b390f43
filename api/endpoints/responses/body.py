"""The body of `POST /v1/responses`, validated into a chat `JobSpec`.

A response runs on the same workers as a chat completion. The job also records what the
Response repeats of the body (`echo`) and its input items.

The conversation starts with `instructions`, as a system message not carried into later turns.
Then come the turns of `previous_response_id`: its input and output, resolved by the endpoint
before `to_spec`. Then comes `input`. A `reasoning` item is the thinking of the assistant turn
after it. That is its sealed `encrypted_content`, opened by the endpoint
(api/endpoints/responses/sealing.py), or its `content`. As for chat, any field this server
does not implement is a 400 naming it.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr

from api.endpoints import images
from api.endpoints.body import (
    MAX_TOOLS,
    Body,
    Effort,
    Function,
    PositiveInt,
    SchemaFormat,
    SchemaName,
    Temperature,
    TopP,
    first_unanswered,
    template_kwargs,
)
from api.endpoints.responses.input import (
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    InputImage,
    InputItem,
    ItemReference,
    MessageItem,
)
from api.endpoints.responses.items import (
    call_item,
    custom_call_item,
    input_id,
    item_chars,
    message_chars,
    message_item,
    output_item,
    reasoning_item,
    to_messages,
)
from api.endpoints.responses.offered import (
    FunctionTool,
    HostedTool,
    NamespaceTool,
    echoed,
    namespaces,
    offered,
    omitted,
)
from api.endpoints.responses.thinking import ENCRYPTED_REASONING, Includable, ReasoningItem
from api.endpoints.responses.tools import CustomTool, ToolChoiceCustom
from api.endpoints.structured import checked_choice, checked_custom, checked_format, checked_tools
from api.http.errors import APIError, invalid
from api.http.parsing import Strict, too_many
from api.settings import Limits
from contract import errors
from contract.jobspec import TEMPERATURE, TOP_P, JobSpec, Message, Tool
from contract.keys import JobField
from contract.media import images as media
from contract.media.images import MARKER

ResponsesTool = Annotated[FunctionTool | CustomTool | NamespaceTool | HostedTool, Field(discriminator="type")]


class ToolChoiceFunction(Function):
    name: str


class TextFormat(SchemaFormat):
    type: Literal["text", "json_object", "json_schema"]
    name: SchemaName | None = None

    def rules(self) -> dict[str, bool]:
        schema = self.type == "json_schema"
        return {
            "text.format.name: a json_schema format needs a name": not schema or self.name is not None,
            "text.format: name and schema go with type json_schema only": (
                schema or (not self.name and self.schema_ is None)
            ),
        }


class TextConfig(Strict):
    format: TextFormat | None = None


class Reasoning(Strict):
    effort: Effort | None = None
    # accepted: no summary is made
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesStreamOptions(Strict):
    # this server never pads its events
    include_obfuscation: bool | None = None


class ResponsesRequest(Body):
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    previous_response_id: str | None = None
    text: TextConfig | None = None
    tools: Annotated[list[ResponsesTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | ToolChoiceCustom | None = None
    parallel_tool_calls: bool | None = None
    stream_options: ResponsesStreamOptions | None = None
    truncation: Literal["disabled"] | None = None
    reasoning: Reasoning | None = None
    # as for chat: the worker closes the thinking after it
    thinking_budget: PositiveInt | None = None
    include: Annotated[list[Includable], Field(max_length=16)] | None = None
    # OpenAI's routing hint: routing and caches are by the prompt's prefixes within the key's
    # cache scope already (contract/prefixes.py); repeated in the Response
    prompt_cache_key: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    # Codex's per-turn metadata: accepted, changes nothing
    client_metadata: (
        Annotated[dict[str, Annotated[str, Field(max_length=16_384)]], Field(max_length=64)] | None
    ) = None

    _history: list[Message] = PrivateAttr(default_factory=list)
    _referenced: dict[str, dict] = PrivateAttr(default_factory=dict)
    _earlier_images: list[images.Image] = PrivateAttr(default_factory=list)

    def rules(self) -> dict[str, bool]:
        return {
            "store: a background response must be stored (store=true)": not (
                self.background and self.store is False
            )
        }

    def references(self) -> list[str]:
        """The ids of the earlier items this input refers to (`item_reference`)."""
        return (
            [i.id for i in self.input if isinstance(i, ItemReference)] if isinstance(self.input, list) else []
        )

    def bind(
        self, history: list[Message], referenced: dict[str, dict], earlier: list[images.Image] | None = None
    ) -> None:
        """The conversation of `previous_response_id` and the items `references` name, as the
        endpoint found them. The images of that conversation come too, in its markers' order."""
        self._history, self._referenced, self._earlier_images = history, referenced, earlier or []

    def image_parts(self) -> list[tuple[str, InputImage]]:
        """Each image part of the input, with where it is (`input[i].content[j]`)."""
        items = self.input if isinstance(self.input, list) else []
        return [
            (f"input[{i}].content[{j}]", part)
            for i, item in enumerate(items)
            if isinstance(item, MessageItem)
            for j, part in item.images()
        ]

    def image_urls(self) -> list[tuple[str, str]]:
        return [(part.image_url, f"{at}.image_url") for at, part in self.image_parts() if part.image_url]

    def _read_images(self, limits: Limits) -> None:
        """The conversation's images: the earlier response's, then the input's, each checked
        (api/endpoints/images.py). Where there are any, no text of the input may hold the
        image marker."""
        found = list(self._earlier_images)
        self._image_params = ["previous_response_id"] * len(found)
        for at, part in self.image_parts():
            if part.image_url is not None:
                image = images.read(part.image_url, f"{at}.image_url", limits, self._fetched)
                found.append(image.at(part.detail))
            else:
                assert part._data is not None, "a file's image is read before to_spec"
                found.append(images.checked(part._data, f"{at}.file_id", limits).at(part.detail))
            images.counted(found, at, limits)
            self._image_params.append(at)
        if self.image_parts():
            for i, item in enumerate(self.input):
                if isinstance(item, MessageItem) and not isinstance(item.content, str):
                    for j, part in enumerate(item.content):
                        if not isinstance(part, InputImage):
                            images.no_marker(part.text, f"input[{i}].content[{j}]")
                elif isinstance(item, MessageItem):
                    images.no_marker(item.content, f"input[{i}].content")
        self._images = found

    def items(self, response_id: str) -> list[dict]:
        """The input as stored items, each with an id."""
        if isinstance(self.input, str):
            return [message_item(input_id(response_id, "msg", 0), "user", self.input)]
        out = []
        for i, item in enumerate(self.input):
            if isinstance(item, ItemReference):
                out.append(self._referenced[item.id])
            elif isinstance(item, MessageItem):
                own = item.id or input_id(response_id, "msg", i)
                out.append(message_item(own, item.role, item.text(), item.stored_parts()))
            elif isinstance(item, FunctionCallItem):
                own = item.id or input_id(response_id, "fc", i)
                out.append(call_item(own, item.call_id, item.name, item.arguments, item.namespace))
            elif isinstance(item, CustomToolCallItem):
                own = item.id or input_id(response_id, "ctc", i)
                out.append(custom_call_item(own, item.call_id, item.name, item.input))
            elif isinstance(item, CustomToolCallOutputItem):
                own = item.id or input_id(response_id, "ctco", i)
                out.append(output_item(own, item.call_id, item.text(), "custom_tool_call_output"))
            elif isinstance(item, ReasoningItem):
                out.append(reasoning_item(item.id or input_id(response_id, "rs", i), item.text()))
            else:
                own = item.id or input_id(response_id, "fco", i)
                out.append(output_item(own, item.call_id, item.text()))
        return out

    def to_spec(self, job_id: str, limits: Limits) -> JobSpec:
        self._read_images(limits)
        messages = [Message("system", self.instructions)] if self.instructions is not None else []
        messages += self._history + to_messages(self.items(job_id))
        _check_conversation(messages)
        found = tuple(image.sha256 for image in self._images)
        if found and media.problem(found, (m.content for m in messages), "chat"):
            raise invalid(f"Invalid 'input': the text {MARKER!r} is reserved where images are sent.", "input")
        tools = self._tools()
        choice = self.tool_choice
        # a tool of that type
        if isinstance(choice, ToolChoiceFunction | ToolChoiceCustom):
            custom = isinstance(choice, ToolChoiceCustom)
            tool_choice = checked_choice(choice.name, tools, "tool_choice.name", custom=custom)
        elif choice in ("auto", "none") and self.tools and not tools:
            # every tool sent is a built-in one, left out: nothing to choose
            tool_choice = choice
        else:
            tool_choice = checked_choice(choice, tools)
        fmt = self.text.format if self.text and self.text.format else None
        return JobSpec(
            id=job_id,
            kind="chat",
            model=self.model,
            messages=tuple(messages),
            images=found,
            low_detail=images.low_detail(self._images),
            max_tokens=self.max_output_tokens or limits.max_tokens,
            temperature=TEMPERATURE if self.temperature is None else float(self.temperature),
            top_p=TOP_P if self.top_p is None else float(self.top_p),
            response_format=checked_format(fmt.type, fmt.schema_, "text.format.schema") if fmt else None,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=self.parallel_tool_calls is not False,
            priority=self.priority,
            template_kwargs=template_kwargs(
                self.reasoning.effort if self.reasoning else None, None, "reasoning"
            ),
            thinking_budget=self.thinking_budget or 0,
        )

    def _tools(self) -> tuple[Tool, ...]:
        """The tools offered, each checked where the request has it. Built-in tools are not offered.
        A namespace's functions are flattened (api/endpoints/responses/offered.py). A custom tool is
        a function of one string."""
        tools = []
        for name, about, params, where, tool in offered(self.tools or []):
            checked = checked_tools([(name, about, params)], where)[0]
            custom = isinstance(tool, CustomTool)
            tools.append(checked_custom(checked, tool.freeform(), f"{where}.format") if custom else checked)
        if len({t.name for t in tools}) != len(tools):
            raise invalid("Invalid 'tools': function names must be unique.", param="tools")
        return tuple(tools)

    def omitted_tools(self) -> list[str]:
        """The built-in tools named, which are never offered (HOSTED_TOOLS)."""
        return omitted(self.tools or [])

    def sealed(self) -> list[tuple[int, ReasoningItem]]:
        """The reasoning items sent back sealed, with their place in `input`."""
        items = self.input if isinstance(self.input, list) else []
        return [(i, x) for i, x in enumerate(items) if isinstance(x, ReasoningItem) and x.encrypted_content]

    def echo(self) -> dict:
        """What the Response object repeats of this request (api/endpoints/responses/objects.py)."""
        fmt = self.text.format if self.text and self.text.format else None
        choice = self.tool_choice
        return {
            "background": bool(self.background),
            "store": self.store is not False,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "previous_response_id": self.previous_response_id,
            "temperature": TEMPERATURE if self.temperature is None else self.temperature,
            "top_p": TOP_P if self.top_p is None else self.top_p,
            "format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"},
            "tool_choice": choice.model_dump() if isinstance(choice, Strict) else choice or "auto",
            "tools": echoed(self.tools or []),
            "namespaces": namespaces(self.tools or []),
            "include_reasoning": ENCRYPTED_REASONING in (self.include or ()),
            "prompt_cache_key": self.prompt_cache_key,
            "user": self.user,
            "metadata": self.metadata or {},
            "service_tier": self.priority,
            "reasoning": self.reasoning.model_dump() if self.reasoning else {"effort": None, "summary": None},
        }

    def job_fields(self, job_id: str) -> dict[str, str]:
        fields = {
            JobField.ECHO: json.dumps(self.echo(), ensure_ascii=False),
            JobField.INPUT: json.dumps(self.items(job_id), ensure_ascii=False),
        }
        if self.store is not False:
            # a later turn's previous_response_id reads it
            fields[JobField.KEEP_SPEC] = "1"
        return fields

    def prompt_chars(self) -> tuple[int, str]:
        chars = len(self.instructions or "")
        chars += sum(message_chars(m) for m in self._history)
        if isinstance(self.input, str):
            chars += len(self.input)
        else:
            for item in self.input:
                if isinstance(item, ItemReference):
                    chars += item_chars(self._referenced.get(item.id, {}))
                elif isinstance(item, FunctionCallItem):
                    chars += len(item.name) + len(item.namespace or "") + len(item.arguments)
                elif isinstance(item, CustomToolCallItem):
                    chars += len(item.name) + len(item.input)
                else:
                    chars += len(item.text())
        chars += sum(len(json.dumps(t.model_dump())) for t in self.tools or ())
        return chars, "input"

    def wanted_tokens(self) -> tuple[int | None, str]:
        return self.max_output_tokens, "max_output_tokens"

    def enforce(self, limits: Limits) -> None:
        turns = len(self._history) + (len(self.input) if isinstance(self.input, list) else 1)
        if turns > limits.max_messages:
            raise too_many("input", limits.max_messages, turns)
        super().enforce(limits)


def _check_conversation(messages: list[Message]) -> None:
    i = first_unanswered(messages)
    if i is not None:
        raise _no_call(messages[i].tool_call_id)


def _no_call(call_id: str) -> APIError:
    return invalid(
        f"No tool call found for function call output with call_id {call_id[:64]!r}.",
        param="input",
        error=errors.INVALID_VALUE,
    )
