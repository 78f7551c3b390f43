"""api/endpoints/messages/blocks.py: Anthropic's content blocks as the models take them, image
sources as URLs, and a tool result's content as its tool message's text."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.endpoints.messages.blocks import (
    InputMessage,
    MediaBlock,
    SystemMessage,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    block_type,
    image_url,
    readable,
    result_images,
    result_text,
)
from api.http.errors import APIError

MARKER = "<__media__>"  # contract/media/images.py: where an image sits in a text
AT = "messages[0].content[1]"


def media(kind: str = "image", **source) -> MediaBlock:
    return MediaBlock.model_validate({"type": kind, "source": source})


def tool_result(*content: dict) -> ToolResultBlock:
    return ToolResultBlock.model_validate(
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": list(content)}
    )


def first_error(model, data: dict) -> tuple[str, tuple]:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    error = caught.value.errors()[0]
    return error["type"], error["loc"]


def test_a_string_content_is_one_text_block_and_each_block_is_chosen_by_its_type():
    assert InputMessage.model_validate({"role": "user", "content": "Hi."}).blocks() == [
        TextBlock(type="text", text="Hi.")
    ]
    message = InputMessage.model_validate(
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Hm.", "signature": "sig"},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
            ],
        }
    )
    kinds = [type(b) for b in message.blocks()]
    assert kinds == [ThinkingBlock, ToolUseBlock, MediaBlock]
    assert message.blocks()[2].model_extra == {
        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}
    }


@pytest.mark.parametrize(
    ("block", "error"),
    [
        ({"type": "audio", "data": "x"}, ("union_tag_invalid", ("content", 0))),
        ({"text": "no type"}, ("union_tag_invalid", ("content", 0))),
        ({"type": "text", "text": "a", "citations": [{}]}, ("too_long", ("content", 0, "text", "citations"))),
        ({"type": "text", "text": "a", "extra": 1}, ("extra_forbidden", ("content", 0, "text", "extra"))),
        (
            {"type": "tool_use", "id": "", "name": "n", "input": {}},
            ("string_too_short", ("content", 0, "tool_use", "id")),
        ),
        (
            {"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "2h"}},
            ("literal_error", ("content", 0, "text", "cache_control", "ttl")),
        ),
        (
            {"type": "tool_use", "id": "t", "name": "n", "input": {}, "caller": {"type": "server"}},
            ("union_tag_invalid", ("content", 0, "tool_use", "caller")),
        ),
    ],
)
def test_a_block_out_of_anthropics_shapes_is_refused_where_it_is(block, error):
    assert first_error(InputMessage, {"role": "user", "content": [block]}) == error


def test_a_system_message_between_the_turns_holds_text_and_media_only():
    said = SystemMessage.model_validate(
        {"role": "system", "content": "# Env", "clear_at": "next_user_message"}
    )
    assert said.blocks() == [TextBlock(type="text", text="# Env")]
    call = {"type": "tool_use", "id": "t", "name": "n", "input": {}}
    assert first_error(SystemMessage, {"role": "system", "content": [call]}) == (
        "union_tag_invalid",
        ("content", 0),
    )
    assert (
        first_error(SystemMessage, {"role": "system", "content": "x", "clear_at": "later"})[0]
        == "literal_error"
    )


def test_block_type_reads_a_dict_or_a_block_and_is_empty_for_anything_else():
    assert block_type({"type": "tool_use"}) == "tool_use"
    assert block_type(media("document")) == "document"
    assert block_type({"type": 3}) == ""
    assert block_type({}) == ""
    assert block_type("text") == ""


def test_an_image_source_is_a_data_url_or_its_own_url_with_the_part_that_holds_it():
    base64 = media(type="base64", media_type="image/jpeg", data="/9j/4A==")
    assert image_url(base64, AT) == ("data:image/jpeg;base64,/9j/4A==", f"{AT}.source.data")
    remote = media(type="url", url="https://example.com/cat.png")
    assert image_url(remote, AT) == ("https://example.com/cat.png", f"{AT}.source.url")


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ({"type": "file", "file_id": "file_1"}, "only base64 and url image sources"),
        ({"type": "url", "url": 5}, "a url source has a url"),
        ({"type": "url"}, "a url source has a url"),
        ({"type": "base64", "data": "AA=="}, "a base64 source has a media_type and data"),
        (
            {"type": "base64", "media_type": "image/png", "data": None},
            "a base64 source has a media_type and data",
        ),
        (None, "only base64 and url image sources"),
    ],
)
def test_an_image_source_that_is_not_one_is_a_400_naming_the_source(source, words):
    block = MediaBlock.model_validate({"type": "image", "source": source})
    with pytest.raises(APIError) as caught:
        image_url(block, AT)
    assert (caught.value.status, caught.value.param) == (400, f"{AT}.source")
    assert words in caught.value.message


def test_media_is_not_readable_where_images_are_not_taken_and_other_blocks_are():
    for kind in ("image", "document"):
        with pytest.raises(APIError) as caught:
            readable(media(kind, type="base64"), 3, 2)
        assert (caught.value.status, caught.value.param) == (400, "messages[3].content[2].type")
        assert f"{kind} blocks are not supported here" in caught.value.message
    readable(TextBlock(type="text", text="fine"), 3, 2)  # raises nothing
    readable({"type": "image"}, 3, 2)  # a dict is not a parsed block


def test_a_tool_result_s_text_joins_its_parts_marks_its_images_and_names_the_tools_found():
    png = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    result = tool_result(
        {"type": "text", "text": "Page: "},
        png,
        {"type": "tool_reference", "tool_name": "search"},
        {"type": "text", "text": " done"},
        {"type": "tool_reference", "tool_name": "fetch"},
    )
    assert result_text(result, 0, 0) == f"Page: {MARKER} done\nTool found: search\nTool found: fetch"
    assert [k for k, _ in result_images(result)] == [1]
    only_found = tool_result({"type": "tool_reference", "tool_name": "search"})
    assert result_text(only_found, 0, 0) == "Tool found: search"  # no empty line before it
    assert result_text(tool_result(), 0, 0) == ""


def test_a_tool_result_s_plain_or_missing_content_is_its_text_as_it_is():
    plain = ToolResultBlock.model_validate({"type": "tool_result", "tool_use_id": "t", "content": "Sun\n"})
    assert result_text(plain, 0, 0) == "Sun\n" and result_images(plain) == []
    empty = ToolResultBlock.model_validate({"type": "tool_result", "tool_use_id": "t", "is_error": True})
    assert result_text(empty, 0, 0) == ""


def test_a_document_in_a_tool_result_is_refused_unless_only_counted():
    result = tool_result({"type": "text", "text": "See:"}, {"type": "document", "source": {}})
    with pytest.raises(APIError) as caught:
        result_text(result, 4, 1)
    assert caught.value.param.startswith("messages[4].content[1]")  # the tool result that holds it
    assert "document blocks are not supported here" in caught.value.message
    assert result_text(result, 4, 1, check=False) == "See:"  # prompt_chars counts, never refuses
    assert result_images(result) == []  # a document is no image
