"""Workers that load their model from the Hugging Face Hub (MODEL_HF): huggingface_hub's real
download code against a stand-in hub on loopback (tests/fake_hub.py, HF_ENDPOINT), with
GGUFs of random weights in a tiny shape (devstack/random_model.py). No test reaches the network."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from devstack.processes import ROOT, Proc, free_port, start_api, start_redis, start_worker, wait_for_model
from devstack.random_model import write
from tests.fake_hub import TOKEN, FakeHub, Repo

pytestmark = pytest.mark.integration

REPO = "acme/tiny-GGUF"


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, bytes]:
    """The stand-in repo's files: two quants of one tiny model and a split F16 one."""
    out = tmp_path_factory.mktemp("ggufs")
    write("tiny", out / "tiny-Q8_0.gguf", "q8_0")
    write("tiny", out / "tiny-Q4_0.gguf", "q4_0", seed=1)
    write("tiny", out / "tiny-F16.gguf", "f16", split_max_size=4_000_000)
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    assert sum("-of-" in name for name in files) > 1, files.keys()
    return {**files, "README.md": b"# tiny\n"}


@dataclass
class Stack:
    hub: FakeHub
    url: str  # Redis
    base: str
    logs: Path

    def worker(self, name: str, home: Path, **env: str) -> Proc:
        env = {"HF_ENDPOINT": self.hub.url, "HF_HOME": str(home), "WARM_UP_SECONDS": "0", "SLOTS": "2", **env}
        return start_worker(self.logs, self.url, name=name, env=env)


@pytest.fixture
def stack(tmp_path, ggufs) -> Iterator[Stack]:
    hub = FakeHub(
        {
            REPO: Repo(dict(ggufs)),
            "acme/gated-GGUF": Repo({"g-Q8_0.gguf": ggufs["tiny-Q8_0.gguf"]}, gated=True),
            "acme/altered-GGUF": Repo(
                {"a-Q8_0.gguf": ggufs["tiny-Q8_0.gguf"]},
                altered={"a-Q8_0.gguf": ggufs["tiny-Q8_0.gguf"][:-1] + b"\x00"},  # the size it says
            ),
        },
        chunk_delay_s=0.3,  # a download of a few seconds: workers started together meet in it
    ).start()
    redis_proc, url = start_redis(tmp_path)
    api, base = start_api(tmp_path, url)
    try:
        yield Stack(hub, url, base, tmp_path)
    finally:
        for p in (api, redis_proc):
            p.stop()
        hub.stop()


def answer(base: str, model: str) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    return httpx.post(base + "/v1/chat/completions", json=body, timeout=60).json()


def test_workers_of_one_host_download_the_model_once_and_serve_it_under_the_repo_s_name(stack, tmp_path):
    home = tmp_path / "hf"
    workers = [stack.worker(f"w{i}", home, MODEL_HF=REPO) for i in range(2)]
    try:
        wait_for_model(stack.base, "tiny-GGUF", procs=tuple(workers))
        assert answer(stack.base, "tiny-GGUF")["usage"]["completion_tokens"] == 4
        assert stack.hub.downloads == {(REPO, "tiny-Q8_0.gguf"): 1}  # no Q4_K_M: Q8_0, fetched once
        logs = workers[0].log() + workers[1].log()
        assert "downloading tiny-Q8_0.gguf:" in logs and " MB/s" in logs
        shared = list((home / "hub").glob("models--acme--tiny-GGUF/snapshots/*/tiny-Q8_0.gguf"))
        assert len(shared) == 1
    finally:
        for w in workers:
            w.stop()


def test_a_split_model_is_downloaded_whole_and_a_quant_picks_by_name(stack, tmp_path):
    split = stack.worker("split", tmp_path / "hf", MODEL_HF=f"{REPO}:f16", MODEL_NAME="tiny-f16")
    quant = stack.worker("quant", tmp_path / "hf", MODEL_HF=f"{REPO}:Q4_0", MODEL_NAME="tiny-q4")
    try:
        for model in ("tiny-f16", "tiny-q4"):
            wait_for_model(stack.base, model, procs=(split, quant))
            assert answer(stack.base, model)["usage"]["completion_tokens"] == 4
        parts = {name for (_, name) in stack.hub.downloads if "-of-" in name}
        assert len(parts) > 1 and all(stack.hub.downloads[(REPO, p)] == 1 for p in parts)
        assert stack.hub.downloads[(REPO, "tiny-Q4_0.gguf")] == 1
    finally:
        split.stop()
        quant.stop()


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"MODEL_HF": "acme/missing-GGUF"}, "acme/missing-GGUF does not exist"),
        ({"MODEL_HF": f"{REPO}:Q5_K_S"}, "has no GGUF named 'Q5_K_S'"),
        ({"MODEL_HF": REPO, "MODEL_HF_FILE": "tiny-Q2_K.gguf"}, "has no GGUF file 'tiny-Q2_K.gguf'"),
        ({"MODEL_HF": "acme/gated-GGUF"}, "acme/gated-GGUF is gated"),
        ({"MODEL_HF": REPO, "HF_HUB_OFFLINE": "1"}, "in neither the cache"),
        ({"MODEL_HF": REPO, "HF_ENDPOINT": "http://user:Sup3rSecretPW@127.0.0.1:9"}, "could not be used"),
        ({"MODEL_HF": REPO, "MODEL_PATH": "/models/x.gguf"}, "MODEL_HF and MODEL_PATH"),
        ({"MODEL_HF": f"{REPO}:Q8_0@{'0' * 40}"}, f"has no revision '{'0' * 40}'"),
        ({"MODEL_HF": "acme/altered-GGUF"}, "sha256 is"),  # a mirror's file is not what the Hub says
    ],
)
def test_a_model_that_cannot_be_had_stops_the_worker_in_seconds_with_one_line_saying_what_to_do(
    stack, tmp_path, env, says
):
    started = time.monotonic()
    worker = stack.worker("doomed", tmp_path / "empty-hf", **env)
    assert worker.popen.wait(timeout=90) != 0
    # an unreachable Hub is tried again a few times (huggingface_hub's backoff: about 25 s)
    assert time.monotonic() - started < (60 if says == "could not be used" else 15)
    said = [line for line in worker.log().splitlines() if says in line]
    assert len(said) == 1, worker.log()[-2000:]
    assert "Sup3rSecretPW" not in worker.log()  # a mirror's credentials are never logged


def test_a_gated_repo_with_a_token_and_an_offline_worker_from_the_cache(stack, tmp_path):
    home = tmp_path / "hf"
    gated = stack.worker("gated", home, MODEL_HF="acme/gated-GGUF", HF_TOKEN=TOKEN)
    try:
        wait_for_model(stack.base, "gated-GGUF", procs=(gated,))
    finally:
        gated.stop()
    stack.hub.stop()  # the Hub is gone: what the cache holds is enough
    offline = stack.worker("offline", home, MODEL_HF="acme/gated-GGUF", HF_HUB_OFFLINE="1")
    try:
        wait_for_model(stack.base, "gated-GGUF", procs=(offline,))
        assert answer(stack.base, "gated-GGUF")["usage"]["completion_tokens"] == 4
    finally:
        offline.stop()


def test_a_pinned_commit_is_served_and_checked_and_found_offline(stack, tmp_path):
    commit = stack.hub.repos[REPO].commit(REPO)
    home = tmp_path / "hf"
    pinned = stack.worker("pinned", home, MODEL_HF=f"{REPO}:Q8_0@{commit}")
    try:
        wait_for_model(stack.base, "tiny-GGUF", procs=(pinned,))
        assert answer(stack.base, "tiny-GGUF")["usage"]["completion_tokens"] == 4
    finally:
        pinned.stop()
    assert f"{REPO}@{commit}" in pinned.log()
    assert [p.name for p in (home / "tokenspool-verified").iterdir()] == [
        hashlib.sha256(stack.hub.repos[REPO].files["tiny-Q8_0.gguf"]).hexdigest()
    ]
    stack.hub.stop()  # the Hub is gone: the cache's snapshot of that commit is enough
    offline = stack.worker("offline", home, MODEL_HF=f"{REPO}:Q8_0@{commit}", HF_HUB_OFFLINE="1")
    try:
        wait_for_model(stack.base, "tiny-GGUF", procs=(offline,))
    finally:
        offline.stop()


def test_the_local_run_serves_a_model_from_the_hub(stack, tmp_path):
    """`scripts/run --model owner/repo:quant` (python -m devstack) downloads it and streams."""
    env = {
        **os.environ,
        "HF_ENDPOINT": stack.hub.url,
        "HF_HOME": str(tmp_path / "hf"),
        "WARM_UP_SECONDS": "0",
    }
    env.pop("REDIS_URL", None)
    argv = [sys.executable, "-m", "devstack", "--once", "--model", f"{REPO}:Q4_0", "--max-tokens", "4"]
    done = subprocess.run(
        [*argv, "--port", str(free_port())], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "[4 tokens in" in done.stdout
    assert stack.hub.downloads == {(REPO, "tiny-Q4_0.gguf"): 1}
