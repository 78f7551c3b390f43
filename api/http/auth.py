"""API keys: `Authorization: Bearer <key>` on every route but the probes. `x-api-key: <key>`
works too, as Anthropic's SDKs send it.

Keys are configured in clear or as `sha256:<hex digest>`, so the configuration need not hold
the secret. They go in `API_KEYS` and/or one per line in `API_KEYS_FILE`. The file is
re-read when it changes (checked at most once a second), so keys rotate without a restart. A
presented key is hashed and compared in constant time against every configured digest. There
is no early exit. Keys are never logged or echoed. The request's `owner` is a prefix of its
key's SHA-256 ("" without keys). A job records it as its creator. Only the same key may
resume, fetch, cancel or purge the job.

A key's `Grant` says what else it may do. A key is a tenant's unless it is in
`OPERATOR_KEYS` or its line in the file says `role=operator`. Only operators read the
pool-wide data on the public port: `/metrics` and `/scaling/...`, which show other tenants'
work. A line may also name the service tiers the key may ask for (`tiers=default,flex`). By
default it may ask for every one. A line may also set the key's own per-minute budgets
(`requests_per_minute=`, `bytes_per_minute=`, `tokens_per_minute=`). A server without keys
is a private one: every caller is its operator.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# the router's own path matching
from starlette._utils import get_route_path
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from api.http.errors import APIError
from contract import errors
from contract.tiers import PRIORITIES

log = logging.getLogger(__name__)

HASH_PREFIX = "sha256:"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


# the `key` label of the keys past METRICS_KEYS, summed
OTHER = "other"


def key_id(owner: str) -> str:
    """A key's id in metrics and traces: 12 hex digits of its SHA-256, never the key."""
    return owner[:12]


OPERATOR, TENANT = "operator", "tenant"


@dataclass(frozen=True)
class Grant:
    """What a key may do beyond its own jobs."""

    role: str = TENANT
    tiers: frozenset[str] = frozenset(PRIORITIES)
    # the key's own per-minute budgets (None: KEY_REQUESTS_PER_MINUTE, KEY_BYTES_PER_MINUTE,
    # KEY_TOKENS_PER_MINUTE; 0: none)
    requests_per_minute: int | None = None
    bytes_per_minute: int | None = None
    tokens_per_minute: int | None = None

    @property
    def operator(self) -> bool:
        return self.role == OPERATOR


# a key line's own budgets
BUDGETS = ("requests_per_minute", "bytes_per_minute", "tokens_per_minute")

# a server without keys: whoever may reach it runs it
PRIVATE = Grant(role=OPERATOR)


def request_owner(request: Request) -> str:
    """Who made the request: its key's owner id, "" without keys."""
    return getattr(request.state, "owner", "")


def request_grant(request: Request) -> Grant:
    return getattr(request.state, "grant", PRIVATE)


def allowed(grant: Grant, tier: str) -> None:
    """A 403 for a service tier the key may not ask for."""
    if tier not in grant.tiers:
        raise APIError(
            errors.TIER_NOT_ALLOWED, f"This key may not use the '{tier}' service tier.", param="service_tier"
        )


def _grant(options: list[str]) -> Grant | None:
    """A key line's options: `role=operator`, `tiers=default,flex`,
    `requests_per_minute=60`, `bytes_per_minute=1000000`, `tokens_per_minute=30000`. None if
    one of them is not a key's option."""
    fields: dict[str, object] = {}
    for option in options:
        name, _, value = option.partition("=")
        if name == "role" and value in (OPERATOR, TENANT):
            fields["role"] = value
        elif name == "tiers" and value and set(value.split(",")) <= set(PRIORITIES):
            fields["tiers"] = frozenset(value.split(","))
        elif name in BUDGETS and value.isascii() and value.isdigit():
            fields[name] = int(value)
        else:
            return None
    return Grant(**fields)  # type: ignore[arg-type]


def parse_keys(
    entries: Sequence[str | None], where: str = "API_KEYS", role: str = TENANT
) -> dict[str, Grant]:
    """Configured keys -> their SHA-256 digests and grants. `sha256:<hex>` entries are
    digests already. An entry is a key, then its options. A malformed entry is skipped with
    a warning that gives its position, never its text. The others stay valid. So a typo does
    not keep alive a key being revoked by rewriting the file."""
    out: dict[str, Grant] = {}
    for n, raw in enumerate(entries, 1):
        if raw is None:
            log.warning("%s: entry %d is not UTF-8 text; skipped", where, n)
            continue
        entry, *options = raw.split() or [""]
        if not entry or entry.startswith("#"):
            continue
        grant = _grant([f"role={role}", *options])
        if grant is None:
            log.warning("%s: entry %d has an option that is not a key's option; skipped", where, n)
            continue
        if entry.startswith(HASH_PREFIX):
            hexd = entry[len(HASH_PREFIX) :].lower()
            if len(hexd) != 64 or any(c not in "0123456789abcdef" for c in hexd):
                log.warning("%s: entry %d is not sha256: and 64 hex digits; skipped", where, n)
                continue
            out[hexd] = grant
        else:
            out[digest(entry)] = grant
    return out


def _lines(raw: bytes) -> list[str | None]:
    """A key file's lines, with None for one that is not UTF-8. `parse_keys` skips it with a
    warning, and the rest of the file still counts."""
    out: list[str | None] = []
    for line in raw.splitlines():
        try:
            out.append(line.decode())
        except UnicodeDecodeError:
            out.append(None)
    return out


class KeyRing:
    """The accepted keys: fixed ones plus those of a file that may change at any time."""

    def __init__(
        self,
        keys: tuple[str, ...] = (),
        path: str | None = None,
        recheck_s: float = 1.0,
        operators: tuple[str, ...] = (),
    ) -> None:
        self._fixed = parse_keys(keys) | parse_keys(operators, "OPERATOR_KEYS", role=OPERATOR)
        self._path = Path(path) if path else None
        self._recheck = recheck_s
        self._file: dict[str, Grant] = {}
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        # owner id -> its place in the configuration
        self._rank: dict[str, int] = {}
        self._reload()
        self._index()

    @property
    def enabled(self) -> bool:
        return bool(self._fixed or self._path)

    def _reload(self) -> None:
        if self._path is None:
            return
        try:
            st = os.stat(self._path)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            keys = parse_keys(_lines(self._path.read_bytes()), "API_KEYS_FILE")
        # unreadable: keep the last set, never lock everyone out
        except (OSError, ValueError) as exc:
            log.error("could not read API_KEYS_FILE (%s); keeping %d keys", exc, len(self._file))
            return
        self._file, self._stamp = keys, stamp
        self._index()
        log.info("API keys loaded from file: %d", len(keys))

    def _index(self) -> None:
        self._rank = {accepted[:32]: n for n, accepted in enumerate(self._fixed | self._file)}

    def _refresh(self) -> None:
        """Read the file again if it may have changed (at most once every `recheck_s`)."""
        now = time.monotonic()
        if self._path is not None and now - self._checked >= self._recheck:
            self._checked = now
            self._reload()

    def owners(self) -> list[tuple[str, Grant]]:
        """Every accepted key's owner id and grant, in the order configured: the
        environment's, then the file's. A key in both comes once, with the file's grant."""
        self._refresh()
        return [(accepted[:32], grant) for accepted, grant in (self._fixed | self._file).items()]

    def label(self, owner: str, shown: int) -> str:
        """The `key` label of `owner` in /metrics. It is its key id if it is one of the
        first `shown` keys configured, else "other". So the series stay bounded however many
        keys there are."""
        rank = self._rank.get(owner)
        return key_id(owner) if rank is not None and rank < shown else OTHER

    def owner(self, presented: str) -> str | None:
        """The owner id of an accepted key, else None."""
        found = self.grant(presented)
        return found[0] if found is not None else None

    def grant(self, presented: str) -> tuple[str, Grant] | None:
        """(owner id, grant) of an accepted key, else None. The file's line wins over the
        environment's for a key in both."""
        self._refresh()
        given = digest(presented)
        found = None
        for accepted, grant in (self._fixed | self._file).items():
            if hmac.compare_digest(given, accepted):
                # no early exit: every digest is compared
                found = grant
        return (given[:32], found) if found is not None else None


PUBLIC_PATHS = frozenset({"/health", "/healthz", "/readyz"})
"""The only routes answered without a key: probes, which say nothing about the pool."""


def for_operators(path: str) -> bool:
    """The routes that show the whole pool (other tenants' work): operator keys only."""
    return path == "/metrics" or path.startswith("/scaling/")


class APIKeyMiddleware:
    """Every route needs a key, but for `public`. That is `PUBLIC_PATHS`, and the browser
    pages' static files when they are served. The path is judged as the router matches it,
    without the root path a proxy or mount strips. So no prefix gets around it."""

    def __init__(self, app: ASGIApp, keys: KeyRing, public: frozenset[str] = PUBLIC_PATHS) -> None:
        self.app = app
        self.keys = keys
        self.public = public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys.enabled or get_route_path(scope) in self.public:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        header = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        # Anthropic's SDKs send theirs so
        if scheme.lower() != "bearer" and b"x-api-key" in headers:
            header = token = headers[b"x-api-key"].decode("latin-1")
            scheme = "bearer"
        found = self.keys.grant(token.strip()) if scheme.lower() == "bearer" else None
        if found is not None and (found[1].operator or not for_operators(get_route_path(scope))):
            state = scope.setdefault("state", {})
            state["owner"], state["grant"] = found
            await self.app(scope, receive, send)
            return
        if found is not None:
            error = APIError(errors.OPERATOR_ONLY)
        else:
            refusal = errors.INVALID_API_KEY if header else errors.MISSING_API_KEY
            error = APIError(refusal, headers={"WWW-Authenticate": "Bearer"})
        services = scope.get("state", {}).get("services")
        if services is not None:
            services.refused(error.code or "", found[0] if found is not None else "")
        await error.response(scope)(scope, receive, send)
