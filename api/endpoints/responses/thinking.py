"""A reasoning item sent back in a Responses request's input, and what `include` may ask for.

`include` may ask for the thinking sealed into each reasoning item of the response
(api/endpoints/responses/sealing.py). A client keeping no state (`store: false`, as Codex
does) can then send it back.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PrivateAttr

from api.http.parsing import Strict


class SummaryText(Strict):
    type: Literal["summary_text"]
    text: str


class ReasoningText(Strict):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(Strict):
    """An earlier turn's thinking, sent back sealed (`encrypted_content`) or as its text
    (`content`). The endpoint opens a sealed one before `to_spec` (`open_with`). Its summary is
    accepted and unused: this server makes none."""

    type: Literal["reasoning"]
    # kept as the item's id in input_items
    id: str | None = None
    # accepted and ignored
    status: str | None = None
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: Annotated[str, Field(min_length=1)] | None = None

    _opened: str | None = PrivateAttr(default=None)

    def open_with(self, text: str) -> None:
        self._opened = text

    def text(self) -> str:
        if self.encrypted_content is not None:
            assert self._opened is not None, "a sealed reasoning item is opened before it is read"
            return self._opened
        return "".join(c.text for c in self.content or ())


ENCRYPTED_REASONING = "reasoning.encrypted_content"
# what `include` may name: the reasoning sealed for the client; the rest name what no response
# here ever holds (built-in tools' calls, input images), so there is nothing to include
Includable = Literal[
    "reasoning.encrypted_content",
    "web_search_call.results",
    "web_search_call.action.sources",
    "file_search_call.results",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "message.input_image.image_url",
]
