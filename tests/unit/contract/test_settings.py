"""contract/settings.py: settings read from an environment by their declared type (groups included),
refusals that name the variable and never show a password, and the rows the docs are generated from."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from contract.settings import (
    Recovery,
    Row,
    SettingError,
    Shared,
    group,
    load,
    one_of,
    rows,
    setting,
    words,
)


@dataclass(frozen=True)
class Inner:
    slots: int = setting(1, "SLOTS", "jobs at once", minimum=1)


@dataclass(frozen=True)
class Example:
    count: int = setting(3, "COUNT", "how many")
    ratio: float = setting(0.5, "RATIO", "a share", minimum=0.25)
    on: bool = setting(False, "ON", "a switch")
    name: str = setting("", "NAME", "a name")
    limit: int | None = setting(None, "LIMIT", "a bound, if any")
    models: tuple[str, ...] = setting((), "MODELS", "a list")
    mode: str = setting("fast", "MODE", "a choice", parse=one_of("MODE", ("fast", "slow")))
    wait_s: float = setting(30.0, "WAIT_SECONDS", "a wait", shown="half a minute")
    inner: Inner = group(Inner)
    internal: int = 7  # no variable: never read, never documented


def test_without_variables_every_setting_keeps_its_default():
    assert load(Example, {}) == Example()
    assert load(Example, {}).inner.slots == 1


def test_each_type_is_read_its_own_way():
    env = {
        "COUNT": " 12 ",
        "RATIO": "0.75",
        "ON": "Yes",
        "NAME": " kept as is ",
        "LIMIT": "40",
        "MODELS": "a, ,b/c-1 ,",
        "MODE": "slow",
        "SLOTS": "4",
    }
    s = load(Example, env)
    assert (s.count, s.ratio, s.on, s.name, s.limit, s.models, s.mode) == (
        12,
        0.75,
        True,
        " kept as is ",
        40,
        ("a", "b/c-1"),
        "slow",
    )
    assert s.inner == Inner(slots=4)  # a group reads the same environment
    assert load(Example, {"LIMIT": "  "}).limit is None  # blank: none


@pytest.mark.parametrize(
    ("raw", "value"), [("1", True), ("on", True), ("TRUE", True), ("0", False), ("", False)]
)
def test_flags_read_the_usual_spellings(raw, value):
    assert load(Example, {"ON": raw}).on is value


@pytest.mark.parametrize(
    ("env", "words_said"),
    [
        ({"COUNT": "many"}, "COUNT='many'"),
        ({"ON": "maybe"}, "expected 1 or 0"),
        ({"MODE": "medium"}, "MODE must be one of ('fast', 'slow')"),
        ({"RATIO": "0.1"}, "RATIO must be at least 0.25, not '0.1'"),
        ({"SLOTS": "0"}, "SLOTS must be at least 1, not '0'"),
        ({"LIMIT": "1.5"}, "LIMIT='1.5'"),
    ],
)
def test_a_value_that_cannot_be_used_stops_the_start_naming_its_variable(env, words_said):
    with pytest.raises(SettingError) as info:
        load(Example, env)
    assert words_said in str(info.value)
    assert isinstance(info.value, SystemExit)  # the process stops with the message


def test_a_list_default_is_never_shared_between_instances():
    @dataclass(frozen=True)
    class Listed:
        extra: list = setting(["a"], "EXTRA", "a list", parse=lambda raw: raw.split("+"))

    first = load(Listed, {})
    first.extra.append("x")
    assert load(Listed, {}).extra == ["a"]
    assert load(Listed, {"EXTRA": "b+c"}).extra == ["b", "c"]


def test_a_type_with_no_parser_is_the_declaration_s_mistake_not_the_environment_s():
    @dataclass(frozen=True)
    class Odd:
        pairs: dict = setting({}, "PAIRS", "no parser for a dict")

    assert load(Odd, {}) == Odd()
    with pytest.raises(TypeError, match="give one with parse="):
        load(Odd, {"PAIRS": "a=1"})


def test_words_drops_blanks():
    assert words(" a ,b,, c ") == ("a", "b", "c")
    assert words("") == ()


def test_rows_document_every_variable_in_declaration_order_groups_included():
    assert rows(Example) == [
        Row("COUNT", "`3`", "how many"),
        Row("RATIO", "`0.5`", "a share"),
        Row("ON", "0", "a switch"),
        Row("NAME", "(none)", "a name"),
        Row("LIMIT", "(none)", "a bound, if any"),
        Row("MODELS", "(none)", "a list"),
        Row("MODE", "`fast`", "a choice"),
        Row("WAIT_SECONDS", "half a minute", "a wait"),
        Row("SLOTS", "`1`", "jobs at once"),
    ]
    assert Row("RESUME_WAIT_SECONDS", "`30`", rows(Recovery)[3].doc) == rows(Recovery)[3]  # 30.0 shown as 30


def test_the_streams_server_is_the_queues_server_unless_named():
    assert load(Shared, {}).streams_url == "redis://127.0.0.1:6379/0"
    assert load(Shared, {"REDIS_URL": "redis://q:6379/1"}).streams_url == "redis://q:6379/1"
    both = load(Shared, {"REDIS_URL": "redis://q:6379/1", "STREAMS_REDIS_URL": "redis+cluster://s:7000"})
    assert (both.redis_url, both.streams_url) == ("redis://q:6379/1", "redis+cluster://s:7000")


def test_a_cluster_for_the_queues_or_a_bad_sentinel_url_is_refused_without_showing_its_password():
    with pytest.raises(SettingError, match="STREAMS_REDIS_URL") as info:
        load(Shared, {"REDIS_URL": "redis+cluster://admin:hunter2@node:7000"})
    assert "hunter2" not in str(info.value) and "REDIS_URL=" in str(info.value)
    with pytest.raises(SettingError, match="sentinel URL") as info:
        load(Shared, {"STREAMS_REDIS_URL": "redis+sentinel://admin:hunter2@s1:26379"})  # no master name
    assert "hunter2" not in str(info.value)
    sentinel = "redis+sentinel://s1:26379,s2/mymaster"
    assert load(Shared, {"STREAMS_REDIS_URL": sentinel}).streams_url == sentinel


def test_recovery_refuses_a_bound_that_would_end_every_job_at_once():
    assert load(Recovery, {"MAX_ATTEMPTS": "5", "RETENTION_SECONDS": "60"}) == Recovery(
        max_attempts=5, retention_s=60
    )
    for env in ("MAX_ATTEMPTS", "MAX_REQUEUES", "SUSPECT_TOKENS"):
        with pytest.raises(SettingError, match=f"{env} must be at least 1"):
            load(Recovery, {env: "0"})
