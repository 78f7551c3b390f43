"""Settings read from the environment: defaults, overrides, and refusals of bad values."""

from __future__ import annotations

import pytest

from api.settings import Settings
from contract.settings import SettingError
from worker.settings import WorkerSettings


def test_queue_limits_per_model_override_the_default():
    s = Settings.from_env({"MAX_QUEUE_DEPTH": "10", "QUEUE_LIMITS": "a=2, org/b-1.5=0"})
    assert s.intake.queue_limit("a") == 2
    assert s.intake.queue_limit("org/b-1.5") == 0
    assert s.intake.queue_limit("other") == 10
    assert Settings.from_env({}).intake.queue_limit("x") == 1000


@pytest.mark.parametrize("raw", ["a", "a=x", "=3", "a=-1"])
def test_bad_queue_limits_are_refused(raw):
    with pytest.raises(SettingError, match="QUEUE_LIMITS"):
        Settings.from_env({"QUEUE_LIMITS": raw})


def test_known_models():
    assert Settings.from_env({"KNOWN_MODELS": "a, b"}).intake.known_models == ("a", "b")


def test_synthetic_engine_needs_an_explicit_synthetic_model_name():
    with pytest.raises(SystemExit, match="MODEL_NAME"):
        WorkerSettings.from_env({"ENGINE": "synthetic"})
    s = WorkerSettings.from_env(
        {"ENGINE": "synthetic", "MODEL_NAME": "synthetic-x", "IDLE_EXIT_SECONDS": "30"}
    )
    assert s.model_path is None and s.engine == "synthetic" and s.idle_exit_s == 30.0
    with pytest.raises(SystemExit, match="ENGINE"):
        WorkerSettings.from_env({"ENGINE": "fake"})


def test_slots_and_prefill_chunk():
    env = {"ENGINE": "synthetic", "MODEL_NAME": "synthetic-x"}
    s = WorkerSettings.from_env({**env, "SLOTS": "8", "PREFILL_CHUNK": "64", "PREFIX_CACHE": "0"})
    assert (s.slots, s.prefill_chunk, s.prefix_cache) == (8, 64, False)
    d = WorkerSettings.from_env(env)
    assert (d.slots, d.prefill_chunk, d.prefix_cache) == (None, 64, True)  # sized at start
    assert (d.batch_share(8), d.batch_share(4), d.batch_share(1), d.batch_share(32)) == (7, 3, 1, 8)
    assert WorkerSettings.from_env({**env, "BATCH_SLOTS": "20"}).batch_share(32) == 20
    assert WorkerSettings.from_env({**env, "BATCH_SLOTS": "3"}).batch_share(2) == 2
    quiet = (d.batch_lend_share(32), d.batch_lend_share(8), d.batch_lend_share(4), d.batch_lend_share(1))
    assert quiet == (16, 7, 3, 1)  # half the slots, never fewer than the share
    assert WorkerSettings.from_env({**env, "BATCH_LEND_SLOTS": "40"}).batch_lend_share(32) == 32
    assert WorkerSettings.from_env({**env, "BATCH_LEND_SLOTS": "4"}).batch_lend_share(32) == 8


@pytest.mark.parametrize("var,raw", [("SLOTS", "0"), ("SLOTS", "two"), ("PREFILL_CHUNK", "-5")])
def test_bad_slots_are_refused(var, raw):
    with pytest.raises(SystemExit, match=var):
        WorkerSettings.from_env({"ENGINE": "synthetic", "MODEL_NAME": "synthetic-x", var: raw})


def test_every_setting_is_declared_once_with_its_variable():
    """A field without a declaration would be a setting the docs and the loader miss."""
    import dataclasses

    from api.settings import Limits
    from contract.settings import Recovery, Shared, rows

    for cls in (Settings, WorkerSettings, Limits, Recovery, Shared):
        for f in dataclasses.fields(cls):
            assert "env" in f.metadata or f.metadata.get("group"), f"{cls.__name__}.{f.name}"
    names = [r.env for r in rows(Settings)] + [r.env for r in rows(WorkerSettings)]
    shared = {r.env for r in rows(Shared) + rows(Recovery)}
    assert len(set(names)) == len(names) - len(shared)  # only the shared groups appear twice


def test_the_configuration_doc_is_generated_from_the_declarations():
    from devstack.configuration import markdown
    from devstack.processes import ROOT

    assert (ROOT / "docs" / "configuration.md").read_text() == markdown(), (
        "docs/configuration.md is stale: run python -m devstack.configuration > docs/configuration.md"
    )


def test_a_bad_value_names_its_variable():
    with pytest.raises(SettingError, match="KEEPALIVE_SECONDS"):
        Settings.from_env({"KEEPALIVE_SECONDS": "soon"})
    assert Settings.from_env({"KEEPALIVE_SECONDS": "2.5"}).lifetimes.keepalive_s == 2.5
    assert WorkerSettings.from_env({"ENGINE": "synthetic", "MODEL_NAME": "synthetic-x", "PREFIX_CACHE": "0"})
    with pytest.raises(SettingError, match="PREFIX_CACHE"):
        WorkerSettings.from_env({"ENGINE": "synthetic", "MODEL_NAME": "synthetic-x", "PREFIX_CACHE": "maybe"})


def test_the_queues_are_never_on_a_cluster_the_streams_may_be():
    with pytest.raises(SettingError, match="REDIS_URL"):
        Settings.from_env({"REDIS_URL": "redis+cluster://h:7000/0"})
    both = Settings.from_env(
        {"REDIS_URL": "redis://q:6379/0", "STREAMS_REDIS_URL": "rediss+cluster://u:p@s:7000/0"}
    )
    assert both.shared.streams_url == "rediss+cluster://u:p@s:7000/0"
    assert Settings.from_env({"REDIS_URL": "redis://q:6379/0"}).shared.streams_url == "redis://q:6379/0"


def test_a_refused_url_is_echoed_without_its_password():
    from contract.settings import Shared, load

    with pytest.raises(SettingError) as refused:
        load(Shared, {"REDIS_URL": "redis+cluster://user:Sup3rSecretPW@host:6379"})
    said = str(refused.value)
    assert "REDIS_URL" in said and "user:***@host" in said and "Sup3rSecretPW" not in said


def test_a_sentinel_url_the_clients_would_refuse_is_refused_at_start():
    for name in ("REDIS_URL", "STREAMS_REDIS_URL"):
        with pytest.raises(SettingError, match=f"{name}.*ssl") as refused:
            Settings.from_env({name: "redis+sentinel://:Sup3rSecretPW@s/m?ssl_ca_certs=/ca.crt"})
        assert "Sup3rSecretPW" not in str(refused.value)


def test_public_prompts_are_read_from_a_json_array_and_a_bad_file_stops_the_start(tmp_path):
    from contract.prefixes import public_digest

    good = tmp_path / "public.json"
    good.write_text('["You are a helpful assistant.", "Sei un assistente."]')
    got = Settings.from_env({"PUBLIC_PROMPTS_FILE": str(good)}).access.public_prompts
    assert got == {public_digest("You are a helpful assistant."), public_digest("Sei un assistente.")}
    assert Settings.from_env({}).access.public_prompts == frozenset()
    for text in ('{"a": 1}', '["ok", ""]', "not json"):
        good.write_text(text)
        with pytest.raises(SettingError, match="PUBLIC_PROMPTS_FILE"):
            Settings.from_env({"PUBLIC_PROMPTS_FILE": str(good)})
    with pytest.raises(SettingError, match="PUBLIC_PROMPTS_FILE"):
        Settings.from_env({"PUBLIC_PROMPTS_FILE": str(tmp_path / "missing.json")})
