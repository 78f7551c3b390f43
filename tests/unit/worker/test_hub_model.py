"""worker/hub_model.py: which GGUF of a Hub repo MODEL_HF names (as llama-server's `-hf`),
and the one line a worker says when it names none."""

from __future__ import annotations

import hashlib
import logging
import os

import pytest

pytest.importorskip("huggingface_hub")  # the worker extra (scripts/setup): tests/unit runs without it
from huggingface_hub import constants

from worker.hub_model import HubModel, LoggedProgress, ModelUnavailable, choose, verify

FILES = [
    "README.md",
    "model-IQ4_XS.gguf",
    "model-Q4_0.gguf",
    "model-Q4_K_M.gguf",
    "model-Q8_0.gguf",
    "mmproj-model-f16.gguf",
    "model.imatrix.gguf",
    "big/model-F16-00001-of-00003.gguf",
    "big/model-F16-00002-of-00003.gguf",
    "big/model-F16-00003-of-00003.gguf",
]


def pick(spec: str, files: list[str] = FILES, file: str | None = None) -> list[str]:
    return choose(HubModel.parse(spec, file), files)


def test_the_quant_picks_the_file_whose_name_holds_it_case_insensitive():
    assert pick("a/b:q4_0") == ["model-Q4_0.gguf"]
    assert pick("a/b:IQ4_XS") == ["model-IQ4_XS.gguf"]
    assert pick("a/b:Q4_K_M") == ["model-Q4_K_M.gguf"]  # not IQ4_K_M's, had there been one


def test_without_a_quant_q4_k_m_then_q8_0_then_the_only_gguf():
    assert pick("a/b") == ["model-Q4_K_M.gguf"]
    assert pick("a/b", [f for f in FILES if "Q4_K_M" not in f]) == ["model-Q8_0.gguf"]
    assert pick("a/b", ["README.md", "only.gguf", "mmproj.gguf"]) == ["only.gguf"]
    with pytest.raises(ModelUnavailable, match="none is Q4_K_M or Q8_0"):
        pick("a/b", ["x-Q5_K.gguf", "x-Q6_K.gguf"])


def test_a_split_model_is_every_part_in_order_whichever_part_names_it():
    parts = [f"big/model-F16-0000{n}-of-00003.gguf" for n in (1, 2, 3)]
    assert pick("a/b:F16") == parts
    assert pick("a/b", file="big/model-F16-00002-of-00003.gguf") == parts


def test_an_exact_file_and_the_refusals_name_the_repo_and_what_to_do():
    assert pick("a/b", file="model-Q8_0.gguf") == ["model-Q8_0.gguf"]
    with pytest.raises(ModelUnavailable, match=r"a/b has no GGUF file 'nope\.gguf': MODEL_HF_FILE"):
        pick("a/b", file="nope.gguf")
    with pytest.raises(ModelUnavailable, match=r"a/b has no GGUF named 'Q5_K'.*after the colon in MODEL_HF"):
        pick("a/b:Q5_K")
    with pytest.raises(ModelUnavailable, match="a/b has 2 GGUF named 'Q4'"):
        pick("a/b:Q4", ["m-Q4.gguf", "n-Q4.gguf"])
    with pytest.raises(ModelUnavailable, match="holds no GGUF"):
        pick("a/b", ["README.md"])


@pytest.mark.parametrize("bad", ["noslash", "a/b/c", "/b", "a/:q", "a/b@", "a/b:q@x y", "a/b@x@y"])
def test_a_spec_is_owner_slash_repo_and_an_optional_quant_and_revision(bad):
    with pytest.raises(ValueError, match="owner/repo"):
        HubModel.parse(bad)
    assert HubModel.parse("bartowski/Llama-3.2-1B-GGUF:Q8_0").name == "Llama-3.2-1B-GGUF"
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert HubModel.parse(f"a/b:Q8_0@{commit}") == HubModel("a/b", "Q8_0", revision=commit)
    assert HubModel.parse("a/b@v1.0") == HubModel("a/b", None, revision="v1.0")


def test_a_file_is_checked_against_the_sha256_its_blob_is_named_for(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "home"))
    data = b"GGUF weights"
    blob = tmp_path / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir()
    blob.write_bytes(data)
    link = tmp_path / "model.gguf"
    link.symlink_to(blob)
    verify("a/b", link)  # the Hub's sha256 (its LFS etag, which names the blob): kept
    verify("a/b", link)  # the second time from the mark it left, not hashed again
    blob.write_bytes(b"GGUF weightz")  # altered later, the same size
    stat = blob.stat()
    os.utime(blob, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # later: a newer mtime
    with pytest.raises(ModelUnavailable, match="sha256") as refused:
        verify("a/b", link)
    assert "a/b" in str(refused.value) and not blob.exists()  # deleted: the next start downloads it again
    small = tmp_path / "blobs" / ("f" * 40)  # a file git keeps itself: no sha256 to check
    small.write_bytes(b"x")
    verify("a/b", small)


def test_progress_is_a_log_line_every_few_seconds_and_one_at_the_end(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="worker.hub_model")
    monkeypatch.setattr(LoggedProgress, "EVERY_S", 0.0)
    bar = LoggedProgress(total=3_000_000, desc="(…)resolve/main/model-Q8_0.gguf", unit="B")
    bar.update(1_000_000)
    bar.update(2_000_000)
    bar.close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[-1].startswith("downloading model-Q8_0.gguf: 3.0 of 3.0 MB")
    assert sum("3.0 of 3.0" in line for line in lines) == 1
