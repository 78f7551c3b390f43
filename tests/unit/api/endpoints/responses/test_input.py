"""api/endpoints/responses/input.py: a Responses request's input items as the client sends them,
each chosen by its type (a message's may be left out), their text with each image marked, and
images stored without their bytes."""

from __future__ import annotations

import json

import pytest

from api.endpoints.responses.input import (
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputImage,
    InputItem,
    ItemReference,
    MessageItem,
)
from api.endpoints.responses.thinking import ReasoningItem
from api.http.errors import APIError
from api.http.parsing import Strict, parse

MARKER = "<__media__>"  # contract/media/images.py: where an image sits in a text
PNG = "data:image/png;base64,iVBORw0KGgo="
IMAGE = {"type": "input_image", "image_url": PNG}


class Items(Strict):
    """The input as ResponsesRequest holds it."""

    input: list[InputItem]


def items(*sent: dict) -> list:
    return parse(Items, json.dumps({"input": list(sent)}).encode()).input


def refusal(*sent: dict) -> APIError:
    with pytest.raises(APIError) as caught:
        items(*sent)
    return caught.value


def test_each_item_is_chosen_by_its_type_and_a_message_may_leave_it_out():
    got = items(
        {"role": "user", "content": "Hi"},
        {"type": "message", "role": "developer", "content": "Rules."},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}", "namespace": "ns"},
        {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
        {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin"},
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": "done", "name": "apply_patch"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm."}]},
        {"type": "item_reference", "id": "msg_abc_0"},
    )
    assert [type(i) for i in got] == [
        MessageItem,
        MessageItem,
        FunctionCallItem,
        FunctionCallOutputItem,
        CustomToolCallItem,
        CustomToolCallOutputItem,
        ReasoningItem,
        ItemReference,
    ]
    assert got[0].type == "message" and got[0].role == "user"
    assert got[2].namespace == "ns" and got[5].name == "apply_patch"


def test_an_item_sent_back_from_an_earlier_response_keeps_its_id_and_its_status_is_ignored():
    sent = {
        "id": "msg_abc_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Sunny.", "annotations": [], "logprobs": []}],
    }
    (item,) = items(sent)
    assert item.id == "msg_abc_1" and item.text() == "Sunny."


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "web_search_call", "id": "ws_1"}, "input[0].type"),
        ({"role": "tool", "content": "x"}, "input[0].role"),
        ({"role": "user"}, "input[0].content"),
        ({"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"}, "input[0].call_id"),
        ({"type": "function_call_output", "call_id": "c", "output": {"a": 1}}, "input[0].output"),
        ({"type": "function_call_output", "call_id": "c", "output": [IMAGE]}, "input[0].output[0].type"),
        ({"role": "user", "content": [{**IMAGE, "detail": "max"}]}, "input[0].content[0].detail"),
        (
            {"role": "assistant", "content": [{"type": "output_text", "text": "", "annotations": [{}]}]},
            "input[0].content[0].annotations",
        ),
        ({"type": "item_reference"}, "input[0].id"),
    ],
)  # fmt: skip
def test_an_item_out_of_shape_is_a_400_naming_where(item, param):
    refused = refusal(item)
    assert (refused.status, refused.param) == (400, param)


@pytest.mark.parametrize(
    "image", [{"type": "input_image"}, {"type": "input_image", "image_url": PNG, "file_id": "file-1"}]
)
def test_an_image_is_a_url_or_a_file_never_both_nor_neither(image):
    refused = refusal({"role": "user", "content": [image]})
    assert refused.status == 400 and "exactly one of image_url and file_id" in refused.message


@pytest.mark.parametrize("role", ["assistant", "system", "developer"])
def test_only_a_user_message_holds_images(role):
    refused = refusal({"role": role, "content": [{"type": "input_image", "image_url": PNG}]})
    assert refused.status == 400 and "input_image parts are for user messages" in refused.message
    (ok,) = items({"role": role, "content": [{"type": "input_text", "text": "x"}]})
    assert ok.text() == "x"


def test_a_message_s_text_joins_its_parts_and_marks_each_image_where_it_is():
    (message,) = items(
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Compare "},
                {"type": "input_image", "image_url": PNG},
                {"type": "input_text", "text": " with "},
                {"type": "input_image", "file_id": "file-1", "detail": "low"},
            ],
        }
    )
    assert message.text() == f"Compare {MARKER} with {MARKER}"
    assert [(j, p.file_id) for j, p in message.images()] == [(1, None), (3, "file-1")]
    (plain,) = items({"role": "user", "content": f"a literal {MARKER}"})
    assert plain.text() == f"a literal {MARKER}" and plain.images() == []


def test_a_message_with_images_is_stored_without_their_bytes_and_one_without_as_text():
    (message,) = items(
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is it?"},
                {"type": "input_image", "image_url": PNG, "detail": "high"},
                {"type": "input_image", "file_id": "file-1"},
            ],
        }
    )
    assert message.stored_parts() == [
        {"type": "input_text", "text": "What is it?"},
        {"type": "input_image", "detail": "high", "file_id": None, "image_url": None},
        {"type": "input_image", "detail": "auto", "file_id": "file-1", "image_url": None},
    ]
    (text_only,) = items({"role": "user", "content": [{"type": "input_text", "text": "x"}]})
    assert text_only.stored_parts() is None
    assert items({"role": "user", "content": "x"})[0].stored_parts() is None


def test_an_image_s_bytes_are_not_read_from_the_request():
    with pytest.raises(APIError) as caught:
        items({"role": "user", "content": [{"type": "input_image", "file_id": "f", "_data": "AAAA"}]})
    assert caught.value.param == "input[0].content[0]._data"
    (message,) = items({"role": "user", "content": [{"type": "input_image", "file_id": "f"}]})
    image = message.images()[0][1]
    assert isinstance(image, InputImage) and image._data is None  # the endpoint reads the file


def test_a_call_s_output_is_its_text_from_a_string_or_text_parts():
    got = items(
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {
            "type": "custom_tool_call_output",
            "call_id": "c2",
            "output": [
                {"type": "input_text", "text": "Applied "},
                {"type": "output_text", "text": "2 hunks."},
            ],
        },
    )
    assert [o.text() for o in got] == ["42", "Applied 2 hunks."]
