"""The Responses API's custom tools, as Codex sends its `apply_patch`.

A custom tool has a name, a description and the input's format. The format is free text or a
grammar (Lark or a regular expression, contract/freeform/). The model calls one as a function
of one string (`checked_custom` in api/endpoints/structured.py). The Response gives the call
back as a `custom_tool_call`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from api.http.parsing import Strict
from contract.freeform.calls import INPUT_SCHEMA


class CustomText(Strict):
    type: Literal["text"]


class CustomGrammar(Strict):
    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: str


class CustomTool(Strict):
    type: Literal["custom"]
    name: str
    description: str | None = None
    # text
    format: Annotated[CustomText | CustomGrammar, Field(discriminator="type")] | None = None

    @property
    def parameters(self) -> dict:
        """Its arguments' schema as the model is offered it: one string, `input`."""
        return INPUT_SCHEMA

    def freeform(self) -> dict:
        """The input's format as the job carries it."""
        return self.format.model_dump() if self.format else {"type": "text"}

    def echoed(self) -> dict:
        """The tool as the Response repeats it."""
        return {
            "type": "custom",
            "name": self.name,
            "description": self.description,
            "format": self.freeform(),
        }


class ToolChoiceCustom(Strict):
    type: Literal["custom"]
    name: str
