"""The three coding agents' CLIs (pinned in tests/js/agents/package.json), each run for one turn,
non-interactively, against a stack in its default configuration: only the base URL, a key
and the model set, as a new user would, in a home of its own so that nothing of this
machine's (their configs, logins, other keys) reaches them, and nothing of theirs is left."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.js_clients import agent_cli

KEY = "sk-agents-test"
AGENTS = ("claude", "codex", "opencode")
# what each needs besides: no update checks, telemetry or downloads at start (none is needed
# for a turn, and CI's machines may reach nothing)
QUIET = {
    "claude": {"DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
    "codex": {},
    "opencode": {
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    },
}


@dataclass(frozen=True)
class Turn:
    argv: list[str]
    env: dict[str, str]
    cwd: Path


# each CLI's own flag to run its shell tool unattended (a turn in print mode asks nobody)
UNATTENDED = {
    "claude": ["--allowedTools=Bash"],
    "codex": ["--dangerously-bypass-approvals-and-sandbox"],  # no sandbox: a container may lack one
    "opencode": [],  # its shell tool runs unasked by default
}


def turn(
    agent: str,
    base: str,
    model: str,
    home: Path,
    prompt: str,
    tools: bool = False,
    flags: Sequence[str] = (),
) -> Turn:
    """The command for one turn of `agent` (`claude -p`, `codex exec`, `opencode run`) asking
    `prompt` of `model` at the API `base`, with `home` as its home and `home`/project its
    project folder; with `tools`, its shell tool runs unattended; `flags`: the CLI's own more."""
    flags = [*(UNATTENDED[agent] if tools else []), *flags]
    project = home / "project"
    project.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", **QUIET[agent]}
    if agent == "claude":
        env |= {
            "ANTHROPIC_BASE_URL": base,
            "ANTHROPIC_API_KEY": KEY,
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,  # its background model, else claude-haiku-*
        }
        return Turn([agent_cli("claude"), "-p", *flags, "--", prompt], env, project)
    if agent == "codex":
        (home / "config.toml").write_text(
            f'model = "{model}"\nmodel_provider = "tokenspool"\n\n'
            "[model_providers.tokenspool]\n"
            f'name = "tokenspool"\nbase_url = "{base}/v1"\nenv_key = "TOKENSPOOL_API_KEY"\n'
            'wire_api = "responses"\n'
        )
        env |= {"CODEX_HOME": str(home), "TOKENSPOOL_API_KEY": KEY}
        return Turn([agent_cli("codex"), "exec", "--skip-git-repo-check", *flags, prompt], env, project)
    provider = {
        "npm": "@ai-sdk/openai-compatible",  # bundled in opencode: nothing is downloaded
        "name": "tokenspool",
        "options": {"baseURL": f"{base}/v1", "apiKey": KEY},
        "models": {model: {"name": model}},
    }
    config = {"provider": {"tokenspool": provider}, "model": f"tokenspool/{model}"}
    (project / "opencode.json").write_text(json.dumps(config))
    env |= {f"XDG_{d}_HOME": str(home / d.lower()) for d in ("CONFIG", "DATA", "CACHE", "STATE")}
    return Turn([agent_cli("opencode"), "run", *flags, prompt], env, project)


def start(t: Turn) -> subprocess.Popen:
    """The turn running, its output read as text (no terminal, nothing on stdin)."""
    return subprocess.Popen(
        t.argv,
        cwd=t.cwd,
        env=t.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(t: Turn, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(
        t.argv,
        cwd=t.cwd,
        env=t.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done
