"""API keys: clear or hashed, from the environment or a file that is re-read when it changes."""

from __future__ import annotations

import hashlib
import os

import pytest

from api.auth import KeyRing, digest, parse_keys


def sha(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def test_clear_and_hashed_keys_are_both_accepted():
    ring = KeyRing(("alpha", sha("beta")))
    assert ring.owner("alpha") == digest("alpha")[:32]
    assert ring.owner("beta") == digest("beta")[:32]
    assert ring.owner("gamma") is None
    assert ring.owner(sha("beta")) is None  # the digest is not itself a key


def test_no_keys_means_no_auth():
    assert not KeyRing().enabled


@pytest.mark.parametrize("bad", ["sha256:abc", "sha256:" + "z" * 64])
def test_malformed_digests_are_refused(bad):
    with pytest.raises(ValueError):
        parse_keys([bad])


def test_key_file_rotation_without_restart(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# rotated monthly\nold-key\n")
    ring = KeyRing(path=str(path), recheck_s=0)
    assert ring.enabled and ring.owner("old-key") and ring.owner("new-key") is None
    path.write_text(f"new-key\n{sha('other')}\n")
    os.utime(path, ns=(1, 1))  # a different mtime even within the clock's resolution
    assert ring.owner("new-key") and ring.owner("other") and ring.owner("old-key") is None


def test_a_broken_key_file_keeps_the_last_good_keys(tmp_path):
    path = tmp_path / "keys"
    path.write_text("k1\n")
    ring = KeyRing(path=str(path), recheck_s=0)
    path.write_text("sha256:nothex\n")
    os.utime(path, ns=(2, 2))
    assert ring.owner("k1")
    path.unlink()
    assert ring.owner("k1")


def test_an_empty_key_file_accepts_nobody(tmp_path):
    path = tmp_path / "keys"
    path.write_text("")
    ring = KeyRing(path=str(path), recheck_s=0)
    assert ring.enabled and ring.owner("") is None and ring.owner("x") is None
