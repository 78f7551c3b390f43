"""api/settings.py: the API's settings read from the environment: defaults, lists, optional
values and flags, closed choices, floors, per-model queue limits and the public prompts file
(tests/unit/test_settings.py covers the loader's shared rules)."""

from __future__ import annotations

import json
import re

import pytest

from api.settings import REASONING_FIELDS, Intake, Settings
from contract.prefixes import public_digest
from contract.settings import SettingError


def test_the_defaults_without_any_variable():
    s = Settings.from_env({})
    assert s.access.api_keys == () and s.access.api_keys_file is None and not s.access.allow_no_auth
    assert s.access.allowed_hosts == ("localhost", "127.0.0.1", "::1")
    assert (s.access.internal_port, s.access.internal_host, s.access.metrics_keys) == (None, "0.0.0.0", 100)
    assert (s.limits.max_body_bytes, s.limits.max_tokens, s.limits.max_stop) == (1_000_000, 8192, 4)
    assert (s.replies.reasoning_field, s.replies.hosted_tools) == ("reasoning_content", "omit")
    assert (s.quotas.key_requests_per_minute, s.quotas.key_tokens_per_minute) == (600, 0)
    assert (s.intake.max_queue_depth, s.intake.queue_limits, s.intake.retry_after_s) == (1000, {}, 5)


def test_lists_are_comma_separated_with_blanks_dropped():
    s = Settings.from_env(
        {
            "API_KEYS": " sk-a, ,sk-b,",
            "OPERATOR_KEYS": "sha256:" + "ab" * 32,
            "CORS_ORIGINS": "https://a.example, https://b.example",
            "IMAGE_URL_HOSTS": "*.example.com",
            "ALLOWED_HOSTS": "*",
            "MATRYOSHKA_MODELS": "",
        }
    )
    assert s.access.api_keys == ("sk-a", "sk-b")
    assert s.access.operator_keys == ("sha256:" + "ab" * 32,)
    assert s.access.cors_origins == ("https://a.example", "https://b.example")
    assert (s.limits.image_url_hosts, s.access.allowed_hosts, s.limits.matryoshka_models) == (
        ("*.example.com",),
        ("*",),
        (),
    )


def test_an_optional_port_is_none_when_blank_and_a_number_otherwise():
    assert Settings.from_env({"INTERNAL_PORT": "9100"}).access.internal_port == 9100
    assert Settings.from_env({"INTERNAL_PORT": "  "}).access.internal_port is None
    with pytest.raises(SettingError, match="INTERNAL_PORT"):
        Settings.from_env({"INTERNAL_PORT": "http"})
    assert Settings.from_env({"API_KEYS_FILE": "/etc/keys"}).access.api_keys_file == "/etc/keys"


def test_flags_take_the_usual_spellings_and_refuse_others():
    for raw, on in (("1", True), ("TRUE", True), ("yes", True), ("0", False), ("no", False), ("", False)):
        s = Settings.from_env({"UI": raw, "ALLOW_NO_AUTH": raw, "RERANK_RAW_SCORES": raw})
        assert (s.access.ui, s.access.allow_no_auth, s.limits.rerank_raw_scores) == (on, on, on), raw
    with pytest.raises(SettingError, match="ALLOW_NO_AUTH"):
        Settings.from_env({"ALLOW_NO_AUTH": "sure"})


def test_a_closed_choice_takes_only_its_values_exactly():
    for field in REASONING_FIELDS:
        assert Settings.from_env({"REASONING_FIELD": field}).replies.reasoning_field == field
    assert Settings.from_env({"HOSTED_TOOLS": "refuse"}).replies.hosted_tools == "refuse"
    for name, raw in (("REASONING_FIELD", "thinking"), ("REASONING_FIELD", "Both"), ("HOSTED_TOOLS", "run")):
        with pytest.raises(SettingError, match=f"{name}.* must be one of"):
            Settings.from_env({name: raw})


@pytest.mark.parametrize(
    ("name", "lowest", "below"),
    [
        ("CACHED_TOKEN_WEIGHT", "0", "-0.1"),
        ("PROMPT_CHARS_PER_TOKEN", "1", "0"),
        ("MAX_RERANK_DOCUMENTS", "1", "0"),
    ],
)
def test_a_value_below_its_floor_is_refused(name, lowest, below):
    Settings.from_env({name: lowest})
    with pytest.raises(SettingError, match=f"{name} must be at least"):
        Settings.from_env({name: below})


def test_queue_limits_keep_the_last_equals_sign_and_the_last_entry_for_a_model():
    s = Settings.from_env({"QUEUE_LIMITS": "org/m=v2=3, a=1, a=7", "MAX_QUEUE_DEPTH": "0"})
    assert s.intake.queue_limits == {"org/m=v2": 3, "a": 7}
    assert (s.intake.queue_limit("org/m=v2"), s.intake.queue_limit("a"), s.intake.queue_limit("b")) == (
        3,
        7,
        0,
    )
    assert Settings.from_env({"QUEUE_LIMITS": " , "}).intake.queue_limits == {}
    with pytest.raises(SettingError, match=re.escape("QUEUE_LIMITS: expected model=N, got 'a=1.5'")):
        Settings.from_env({"QUEUE_LIMITS": "ok=2,a=1.5"})
    assert Intake(queue_limits={"m": 0}, max_queue_depth=9).queue_limit("m") == 0  # 0 overrides: no limit


def test_public_prompts_are_kept_as_digests_of_exactly_their_text(tmp_path):
    path = tmp_path / "public.json"
    path.write_text(json.dumps(["Tu es un assistant.", "Tu es un assistant. "]), encoding="utf-8")
    got = Settings.from_env({"PUBLIC_PROMPTS_FILE": str(path)}).access.public_prompts
    assert got == {public_digest("Tu es un assistant."), public_digest("Tu es un assistant. ")}
    assert "Tu es un assistant." not in got  # the prompts themselves are not kept
    path.write_text('["ok", 3]')
    with pytest.raises(SettingError, match="expected a JSON array of non-empty strings"):
        Settings.from_env({"PUBLIC_PROMPTS_FILE": str(path)})
    path.write_text("[]")
    assert Settings.from_env({"PUBLIC_PROMPTS_FILE": str(path)}).access.public_prompts == frozenset()


def test_from_env_reads_the_process_environment_by_default(monkeypatch):
    monkeypatch.setenv("MAX_JOBS_PER_KEY", "3")
    monkeypatch.setenv("KNOWN_MODELS", "cold-a,cold-b")
    monkeypatch.delenv("MAX_TOKENS_LIMIT", raising=False)
    s = Settings.from_env()
    assert (s.quotas.max_jobs_per_key, s.intake.known_models, s.limits.max_tokens) == (
        3,
        ("cold-a", "cold-b"),
        8192,
    )
    assert Settings.from_env({}).quotas.max_jobs_per_key == 64  # a mapping given: the environment is not read
