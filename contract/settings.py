"""Settings declared once.

Each is a dataclass field that names its environment variable, its default and its meaning.
Nothing else repeats them.

`load(cls, env)` reads a settings class from the environment. Nested groups are included: the
API and the workers share `Recovery` and `Shared`. `rows(cls)` renders the same declarations as
documentation. So docs/configuration.md is generated from them (`python -m
devstack.configuration`), and a test checks that it is current. A value that cannot be read
stops the process at start, with a message naming the variable.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from contract import failover
from contract.logs import redacted


class SettingError(SystemExit):
    """A variable's value cannot be used. It is said at start, before anything else happens."""


def setting(
    default: Any,
    env: str,
    doc: str,
    *,
    parse: Callable[[str], Any] | None = None,
    shown: str | None = None,
    minimum: float | None = None,
) -> Any:
    """A field read from `env`.

    `parse` turns the raw string into the value (default: by the field's type). `shown` is the
    default as the documentation says it. It is for where the value alone would mislead ("half
    the cores"). `minimum` refuses smaller values."""
    meta = {"env": env, "doc": doc, "parse": parse, "shown": shown, "minimum": minimum}
    if isinstance(default, list | dict | set):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def group(cls: type) -> Any:
    """A nested settings class, read from the same environment."""
    return field(default_factory=cls, metadata={"group": True})


def one_of(env: str, values: tuple[str, ...]) -> Callable[[str], str]:
    """A parser taking exactly one of `values` (a setting's closed choice)."""

    def parse(raw: str) -> str:
        if raw not in values:
            raise ValueError(f"{env} must be one of {values}")
        return raw

    return parse


def words(raw: str) -> tuple[str, ...]:
    """A comma-separated list, blanks dropped."""
    return tuple(w.strip() for w in raw.split(",") if w.strip())


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected 1 or 0")


def _number(kind: type) -> Callable[[str], Any]:
    def parse(raw: str) -> Any:
        return kind(raw.strip())

    return parse


def _parser(hint: Any) -> Callable[[str], Any]:
    """How a field of this type is read from a string."""
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        hint = args[0]
    if hint is bool:
        base: Callable[[str], Any] = _flag
    elif hint in (int, float):
        base = _number(hint)
    elif hint is str:
        base = str
    elif typing.get_origin(hint) is tuple:
        base = words
    else:
        raise TypeError(f"no parser for settings of type {hint!r}: give one with parse=")
    if not optional:
        return base
    return lambda raw: base(raw) if raw.strip() else None


def _declared(cls: type) -> Iterator[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield f, hints[f.name]


def load(cls: type, env: Mapping[str, str]) -> Any:
    """An instance of `cls` with every declared variable present in `env` applied."""
    values: dict[str, Any] = {}
    for f, hint in _declared(cls):
        if f.metadata.get("group"):
            values[f.name] = load(hint, env)
            continue
        name = f.metadata.get("env")
        if name is None or name not in env:
            continue
        parse = f.metadata["parse"] or _parser(hint)
        try:
            value = parse(env[name])
        except (ValueError, TypeError) as exc:
            raise SettingError(redacted(f"{name}={env[name]!r}: {exc}")) from None
        minimum = f.metadata["minimum"]
        if minimum is not None and value is not None and value < minimum:
            raise SettingError(redacted(f"{name} must be at least {minimum:g}, not {env[name]!r}"))
        values[f.name] = value
    return cls(**values)


@dataclass(frozen=True)
class Row:
    env: str
    default: str
    doc: str


def _shown(f: dataclasses.Field) -> str:
    if f.metadata.get("shown"):
        return f.metadata["shown"]
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    if value is None or value in ((), {}, ""):
        return "(none)"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def rows(cls: type) -> list[Row]:
    """The documentation of every variable `cls` reads, groups included, in declaration order."""
    out: list[Row] = []
    for f, hint in _declared(cls):
        if f.metadata.get("group"):
            out += rows(hint)
        elif "env" in f.metadata:
            out.append(Row(f.metadata["env"], _shown(f), f.metadata["doc"]))
    return out


def _one_server(raw: str) -> str:
    """REDIS_URL: RQ's queues need one server, never a cluster."""
    if "+cluster://" in raw.split("@", 1)[0]:
        raise ValueError("RQ's queues need one server: give a cluster as STREAMS_REDIS_URL")
    return _server(raw)


def _server(raw: str) -> str:
    """A Redis URL. A sentinel URL the clients would refuse is refused now, at start."""
    failover.sentinel_target(raw)
    return raw


@dataclass(frozen=True)
class Shared:
    """What the API and the workers both read, and must agree on."""

    redis_url: str = setting(
        "redis://127.0.0.1:6379/0",
        "REDIS_URL",
        "`redis://` or `rediss://` (TLS), or `redis+sentinel://host:26379,host2:26379/<master name>` "
        "(a primary watched by Redis Sentinel, followed through failovers): the Redis both sides use; "
        "with STREAMS_REDIS_URL, the queues server only (RQ's queues, the worker registry, stats, "
        "owners' limits, files, batches)",
        parse=_one_server,
    )
    streams_redis_url: str = setting(
        "",
        "STREAMS_REDIS_URL",
        "the Redis of the job hashes, token streams and heartbeats (the streams server), when it "
        "is not REDIS_URL's: the same forms, or `redis+cluster://` (docs/operations.md, "
        '"Two Redis servers")',
        shown="REDIS_URL",
        parse=_server,
    )
    log_format: str = setting("json", "LOG_FORMAT", "`json` (one object per line) or `text`")
    log_level: str = setting("INFO", "LOG_LEVEL", "the lowest level logged")

    @property
    def streams_url(self) -> str:
        """The streams server's URL (contract/keys.py says what it holds)."""
        return self.streams_redis_url or self.redis_url


@dataclass(frozen=True)
class Recovery:
    """How jobs live and move between workers: the API and the workers read the same values."""

    max_attempts: int = setting(
        3,
        "MAX_ATTEMPTS",
        "worker deaths in a row charged to a job before it ends with `worker_lost`: a death is "
        "charged to a job that stood still (went less than SUSPECT_TOKENS on) and ran alone or "
        "was its worker's only suspect, and the count starts again once it goes SUSPECT_TOKENS past "
        "where it died (docs/operations.md)",
        minimum=1,
    )
    max_requeues: int = setting(
        20,
        "MAX_REQUEUES",
        "times a job may be taken from a worker standing still (deaths charged or not, hand-offs; "
        "an attempt that went SUSPECT_TOKENS on does not count) before it ends with `worker_lost`",
        minimum=1,
    )
    suspect_tokens: int = setting(
        2,
        "SUSPECT_TOKENS",
        "tokens an attempt must write for its job to have gone on past where it last died (else "
        "it stood still: a job standing still at two deaths in a row becomes a suspect); a "
        "worker's suspects step as one group, apart from jobs still reading, until each has "
        "generated this many, then each is cleared: a job that kills workers where it stands "
        "dies again before that, in groups halved at each such death until it is alone and charged",
        minimum=1,
    )
    resume_wait_s: float = setting(
        30.0,
        "RESUME_WAIT_SECONDS",
        "a dead attempt's job not resumed by then ends with `worker_lost`, unless the pool can still "
        "run it (a live worker has a free slot or keeps stepping, or one is starting for its model): "
        "then it waits another period",
    )
    job_timeout_s: int = setting(1800, "JOB_TIMEOUT_SECONDS", "RQ's job timeout")
    job_ttl_s: int = setting(86_400, "JOB_TTL_SECONDS", "upper bound on an unfinished job's keys")
    retention_s: int = setting(
        3600, "RETENTION_SECONDS", "how long an ended job's keys stay in Redis (resume, fetch)"
    )
