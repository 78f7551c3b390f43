"""The input items of a Responses request, as the client sends them.

They are messages (text, and images in a user's), and function and custom tool calls. The
others are the calls' outputs, reasoning, and references to earlier items. A message may
leave out its type, as the SDKs' "easy" input message does."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Discriminator, Field, PrivateAttr, Tag

from api.endpoints.responses.thinking import ReasoningItem
from api.http.parsing import Strict
from contract.media.images import MARKER


class InputText(Strict):
    type: Literal["input_text"]
    text: str


class InputImage(Strict):
    """An image in a user message: a `data:` URL, or the id of an uploaded file. The file has
    purpose `vision` or `user_data`. The endpoint reads its bytes before `to_spec`. `detail: low`
    shrinks the image before the model reads it (docs/requests.md)."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["low", "high", "auto"] | None = None

    _data: bytes | None = PrivateAttr(default=None)

    def rules(self) -> dict[str, bool]:
        return {
            "input_image: give exactly one of image_url and file_id": (self.image_url is None)
            != (self.file_id is None)
        }

    def stored(self) -> dict:
        """As the input items list it: the image itself is not repeated. OpenAI's `include` of
        `message.input_image.image_url` would repeat it. Nothing here keeps it that long."""
        return {
            "type": "input_image",
            "detail": self.detail or "auto",
            "file_id": self.file_id,
            "image_url": None,
        }


class OutputText(Strict):
    """An earlier answer's text, sent back as part of an assistant message."""

    type: Literal["output_text"]
    text: str
    annotations: Annotated[list, Field(max_length=0)] | None = None
    logprobs: list | None = None


class _Item(Strict):
    """What an input item sent back from an earlier Response may carry. Its id is kept as the item's
    id in input_items. Its status is accepted and ignored."""

    id: str | None = None
    status: str | None = None


def _joined(content: str | list[InputText | OutputText] | list[InputText | OutputText | InputImage]) -> str:
    """The parts' text, each image its marker (contract/media/images.py)."""
    if isinstance(content, str):
        return content
    return "".join(MARKER if isinstance(p, InputImage) else p.text for p in content)


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[Annotated[InputText | OutputText | InputImage, Field(discriminator="type")]]

    def rules(self) -> dict[str, bool]:
        return {
            "content: input_image parts are for user messages": self.role == "user"
            or not any(isinstance(p, InputImage) for p in self.content)
        }

    def text(self) -> str:
        return _joined(self.content)

    def images(self) -> list[tuple[int, InputImage]]:
        """The image parts, with their place in `content`."""
        parts = [] if isinstance(self.content, str) else self.content
        return [(j, p) for j, p in enumerate(parts) if isinstance(p, InputImage)]

    def stored_parts(self) -> list[dict] | None:
        """The content as stored items hold it, where it has images (None: text only)."""
        if not self.images():
            return None
        assert not isinstance(self.content, str)
        return [
            p.stored() if isinstance(p, InputImage) else {"type": p.type, "text": p.text}
            for p in self.content
        ]


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: str
    # a namespaced function's (api/endpoints/responses/offered.py)
    namespace: str | None = None
    arguments: str


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: str | list[Annotated[InputText | OutputText, Field(discriminator="type")]]

    def text(self) -> str:
        return _joined(self.output)


class CustomToolCallItem(_Item):
    type: Literal["custom_tool_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: str
    input: str


class CustomToolCallOutputItem(FunctionCallOutputItem):
    type: Literal["custom_tool_call_output"]  # type: ignore[assignment]
    # Codex sends it: the call_id says which call it answers
    name: str | None = None


class ItemReference(Strict):
    type: Literal["item_reference"]
    id: str


def _item_type(value: object) -> str:
    """A message item may leave out its type (the SDKs' "easy" input message)."""
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    return kind if isinstance(kind, str) else "message"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("custom_tool_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[ItemReference, Tag("item_reference")],
    Discriminator(_item_type),
]
