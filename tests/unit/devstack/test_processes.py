"""devstack.processes: a local API keeps the keys the shell gives it, and the local run's own
requests send one of them."""

from __future__ import annotations

import pytest

from devstack.processes import api_env, demo_key


def test_an_api_without_keys_serves_keyless_and_one_with_keys_keeps_them(monkeypatch):
    for name in ("API_KEYS", "API_KEYS_FILE", "ALLOW_NO_AUTH"):
        monkeypatch.delenv(name, raising=False)
    assert api_env("redis://x")["ALLOW_NO_AUTH"] == "1"
    assert "ALLOW_NO_AUTH" not in api_env("redis://x", {"API_KEYS": "sk-a"})
    monkeypatch.setenv("API_KEYS_FILE", "/etc/keys")  # in the shell: never overridden
    assert "ALLOW_NO_AUTH" not in api_env("redis://x")


def test_the_demo_key_is_the_first_given_in_clear(tmp_path):
    assert demo_key({}) is None
    assert demo_key({"API_KEYS": f"sha256:{'0' * 64}, sk-a ,sk-b"}) == "sk-a"
    keys = tmp_path / "keys"
    keys.write_text(f"# ours\n\nsha256:{'1' * 64} role=operator\nsk-file tiers=default\n")
    assert demo_key({"API_KEYS_FILE": str(keys)}) == "sk-file"
    with pytest.raises(SystemExit, match="only sha256: digests"):
        demo_key({"API_KEYS": f"sha256:{'0' * 64}"})
