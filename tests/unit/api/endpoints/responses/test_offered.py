"""A namespace's functions are offered under one flattened name each, told back as the
function and its namespace; built-in tools are never offered: left out, or refused."""

from __future__ import annotations

import pytest

from api.endpoints.responses.offered import HOSTED, HostedTool, flat_name, refuse_hosted
from api.http.errors import APIError
from contract.jobspec import TOOL_NAME


@pytest.mark.parametrize(
    ("namespace", "name", "flat"),
    [
        ("multi_agent_v1", "spawn_agent", "multi_agent_v1__spawn_agent"),
        ("mcp__github__", "get_me", "mcp__github__get_me"),  # a namespace ending in __ is joined as is
        ("mcp__sc", "get_class_overview", "mcp__sc__get_class_overview"),
    ],
)
def test_a_namespaced_function_is_the_two_names_joined(namespace, name, flat):
    assert flat_name(namespace, name) == flat


def test_a_name_too_long_keeps_its_head_and_a_digest_of_both():
    long_a, long_b = flat_name("n" * 40, "f" * 40), flat_name("n" * 40, "f" * 39 + "g")
    assert len(long_a) == 64 and TOOL_NAME.fullmatch(long_a)
    assert long_a[:55] == long_b[:55] and long_a != long_b


def test_refusing_names_the_first_built_in_tool():
    tools = [HostedTool.model_validate({"type": t, "anything": {"goes": 1}}) for t in ("web_search", "mcp")]
    with pytest.raises(APIError) as caught:
        refuse_hosted(tools)
    assert caught.value.status == 400 and caught.value.param == "tools[0].type"
    assert "web_search" in caught.value.message and "HOSTED_TOOLS" in caught.value.message
    refuse_hosted([])  # nothing to refuse
    assert "custom" not in HOSTED and "function" not in HOSTED and "namespace" not in HOSTED
