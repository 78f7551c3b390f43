"""What the reasoning tests share (test_reasoning.py's `<think>` and test_harmony.py's harmony):
a pool of workers of one thinking model, and a stream whose worker is SIGKILLed mid-thinking."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass

import httpx
import openai
import redis

from contract import keys
from devstack.processes import Proc


@dataclass
class Pool:
    base: str
    r: redis.Redis
    workers: dict[str, Proc]

    def sdk(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key="unused", max_retries=0, timeout=120)

    def holder(self, job_id: str) -> Proc:
        return self.workers[self.r.hget(keys.job(job_id), keys.JobField.WORKER).decode()]


def killed_mid_thinking(pool: Pool, model: str, messages: list[dict], marker: str) -> None:
    """Stream a completion, SIGKILL its worker once 20 characters of thinking came, and check
    that the stitched stream and the replay after the end agree, no content delta holding
    `marker`, the job having gone on on another worker (the pool loses one)."""
    body = {"model": model, "messages": messages, "max_tokens": 96, "temperature": 0, "stream": True}
    reasoning: list[str] = []
    killed = False
    with httpx.Client(base_url=pool.base, timeout=120) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as resp:
            job_id = None
            for line in resp.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                job_id = chunk["id"]
                for choice in chunk["choices"]:
                    assert marker not in (choice["delta"].get("content") or "")
                    reasoning.append(choice["delta"].get("reasoning_content", ""))
                if not killed and len("".join(reasoning)) > 20:
                    pool.holder(job_id).signal(signal.SIGKILL)
                    killed = True
        assert killed and job_id is not None
        deadline = time.monotonic() + 60
        while (replay := http.get(f"/v1/chat/completions/{job_id}")).status_code == 202:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    message = replay.json()["choices"][0]["message"]
    assert message["reasoning_content"] == "".join(reasoning)
    events = pool.r.xrange(keys.events(job_id))
    assert sum(f[b"k"] == b"s" for _, f in events) == 2  # it went on on the other worker
