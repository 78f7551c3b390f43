"""`python -m devstack.configuration > docs/configuration.md`: the configuration reference,
generated from the settings declarations of both processes (a test checks it is current)."""

from __future__ import annotations

import dataclasses
import inspect
import typing

from api.settings import Settings
from contract.settings import Recovery, Shared, rows
from worker.settings import WorkerSettings


def _table(cls: type, skip: frozenset[str] = frozenset(), header: bool = True) -> list[str]:
    lines = ["| variable | default | meaning |", "|---|---|---|"] if header else []
    return lines + [f"| `{r.env}` | {r.default} | {r.doc} |" for r in rows(cls) if r.env not in skip]


def _groups(cls: type, skip: frozenset[str]) -> list[str]:
    """One table per settings group of `cls` that has a variable not in `skip`, headed by the
    first line of the group's docstring."""
    out: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        group = hints[f.name]
        if any(r.env not in skip for r in rows(group)):
            out += [f"### {f.name.title()}", "", inspect.getdoc(group) or "", "", *_table(group, skip), ""]
    return out


def markdown() -> str:
    shared = frozenset(r.env for r in rows(Shared) + rows(Recovery))
    out = [
        "# Configuration",
        "",
        "Generated from the declarations in `contract/settings.py`, `api/settings.py` and",
        "`worker/settings.py` by `python -m devstack.configuration`; a test checks that this",
        "file is current. Every value comes from the environment.",
        "",
        "## Both processes",
        "",
        "The API and the workers read these and must agree on them.",
        "",
        *_table(Shared),
        *_table(Recovery, header=False),
        "",
        "## API (`uvicorn --factory api.app:create_app`)",
        "",
        *_groups(Settings, shared),
        "## Worker (`python -m worker`)",
        "",
        *_table(WorkerSettings, shared),
        "",
        "`scripts/setup` honours `LLAMA_CMAKE_ARGS` (build flags for llama-cpp-python) and",
        "`TOKENSPOOL_WHEEL_CACHE` (where built wheels are kept, keyed by version and flags).",
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown(), end="")
