"""The content blocks of a Messages request (Anthropic's).

They are text, tool calls and results, earlier thinking, and the media a text-only model
refuses. The body (api/endpoints/messages/body.py) turns them into chat messages."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, field_validator

from api.http.errors import invalid
from api.http.parsing import Strict
from contract.media.images import MARKER


class CacheControl(Strict):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class _Block(Strict):
    cache_control: CacheControl | None = None


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: Annotated[list, Field(max_length=0)] | None = None


class MediaBlock(_Block):
    """An image or a document. An image in a user turn or a tool result is read as an image
    (body.py). An image anywhere else is refused, and so is any document. The 400 is a clear one
    (`readable`), not one for an unknown block."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: Literal["image", "document"]


class DirectCaller(Strict):
    type: Literal["direct"]


class ServerToolCaller(Strict):
    type: Literal["code_execution_20250825", "code_execution_20260120"]
    tool_id: str


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1)]
    name: str
    input: dict
    # What made the call (the model, or Anthropic's code execution) and an MCP toolset's name:
    # the SDK's `model_dump()` of a block it received sends them back; the prompt needs neither.
    caller: Annotated[DirectCaller | ServerToolCaller, Field(discriminator="type")] | None = None
    toolset_name: str | None = None


class ToolReferenceBlock(_Block):
    """A tool search's result: a tool found. Every tool is in the prompt already, deferred or
    not. So the model reads the found tool's name."""

    type: Literal["tool_reference"]
    tool_name: str


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1)]
    content: (
        str | list[Annotated[TextBlock | MediaBlock | ToolReferenceBlock, Field(discriminator="type")]] | None
    ) = None
    is_error: bool | None = None
    # its tool_use's (see there)
    toolset_name: str | None = None


class ThinkingBlock(Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(Strict):
    type: Literal["redacted_thinking"]
    data: str


def block_type(value: object) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) else ""


Block = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[MediaBlock, Tag("image")]
    | Annotated[MediaBlock, Tag("document")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")],
    Discriminator(block_type),
]


def text_blocks(value: object) -> object:
    """A string content is one text block."""
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


class InputMessage(Strict):
    role: Literal["user", "assistant"]
    content: list[Block]

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, value: object) -> object:
        return text_blocks(value)

    def blocks(self) -> list:
        return self.content


class SystemMessage(Strict):
    """A system message between the turns (Claude Code's environment notes). It becomes a system
    message at its place. `clear_at: "next_user_message"` shows it only until a later user turn."""

    role: Literal["system"]
    content: list[Annotated[TextBlock | MediaBlock, Field(discriminator="type")]]
    clear_at: Literal["next_user_message", "never"] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, value: object) -> object:
        return text_blocks(value)

    def blocks(self) -> list:
        return self.content


def is_image(block: object) -> bool:
    return isinstance(block, MediaBlock) and block.type == "image"


def image_url(block: MediaBlock, at: str) -> tuple[str, str]:
    """An image block's source as a URL, with its part (api/endpoints/images.py reads it). A
    `base64` source becomes a data URL. A `url` source stays itself, fetched where IMAGE_URL_HOSTS
    allows it. A `file` source is a 400 naming it."""
    source = (block.model_extra or {}).get("source")
    if isinstance(source, dict) and source.get("type") == "url":
        if not isinstance(url := source.get("url"), str):
            raise invalid(f"Invalid '{at}.source': a url source has a url.", f"{at}.source")
        return url, f"{at}.source.url"
    if not isinstance(source, dict) or source.get("type") != "base64":
        why = f"Invalid '{at}.source': only base64 and url image sources are taken here."
        raise invalid(why, f"{at}.source")
    media, data = source.get("media_type"), source.get("data")
    if not isinstance(media, str) or not isinstance(data, str):
        raise invalid(f"Invalid '{at}.source': a base64 source has a media_type and data.", f"{at}.source")
    return f"data:{media};base64,{data}", f"{at}.source.data"


def readable(block: object, i: int, j: int) -> None:
    if isinstance(block, MediaBlock):
        raise invalid(
            f"Invalid 'messages[{i}].content[{j}]': {block.type} blocks are not supported here "
            "(images are taken in user turns and tool results).",
            f"messages[{i}].content[{j}].type",
        )


def result_images(block: ToolResultBlock) -> list[tuple[int, MediaBlock]]:
    """A tool result's image blocks, with their place in its content."""
    parts = block.content if isinstance(block.content, list) else []
    return [(k, p) for k, p in enumerate(parts) if is_image(p) and isinstance(p, MediaBlock)]


def result_text(block: ToolResultBlock, i: int, j: int, check: bool = True) -> str:
    """The result as the tool message's text. Each image is its marker, each tool found named."""
    if block.content is None or isinstance(block.content, str):
        return block.content or ""
    parts, found = [], []
    for part in block.content:
        # a screenshot a tool sent back: its place in the result's text
        if is_image(part):
            parts.append(MARKER)
            continue
        if check:
            readable(part, i, j)
        if isinstance(part, TextBlock):
            parts.append(part.text)
        elif isinstance(part, ToolReferenceBlock):
            found.append(f"Tool found: {part.tool_name}")
    return "\n".join(t for t in ("".join(parts), *found) if t)
