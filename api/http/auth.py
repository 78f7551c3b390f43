"""API keys: `Authorization: Bearer <key>` (or `x-api-key: <key>`, as Anthropic's SDKs send it)
on every route but the probes.

Keys are configured in clear or as `sha256:<hex digest>` (so the configuration need not hold
the secret), in `API_KEYS` and/or one per line in `API_KEYS_FILE`. The file is re-read when
it changes (checked at most once a second), so keys rotate without a restart. A presented
key is hashed and compared in constant time against every configured digest (no early
exit); keys are never logged or echoed. The request's `owner` (a prefix of its key's
SHA-256, "" without keys) is what a job records as its creator: only the same key may
resume, fetch, cancel or purge it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from starlette._utils import get_route_path  # the router's own path matching
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from api.http.errors import APIError
from contract import errors

log = logging.getLogger(__name__)

HASH_PREFIX = "sha256:"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def request_owner(request: Request) -> str:
    """Who made the request: its key's owner id, "" without keys."""
    return getattr(request.state, "owner", "")


def parse_keys(entries: Sequence[str | None], where: str = "API_KEYS") -> frozenset[str]:
    """Configured keys -> their SHA-256 digests (`sha256:<hex>` entries are digests already).
    A malformed entry is skipped with a warning (its position, never its text): the others
    stay valid, and a key being revoked by rewriting the file is not kept alive by a typo."""
    out = set()
    for n, raw in enumerate(entries, 1):
        if raw is None:
            log.warning("%s: entry %d is not UTF-8 text; skipped", where, n)
            continue
        entry = raw.strip()
        if not entry or entry.startswith("#"):
            continue
        if entry.startswith(HASH_PREFIX):
            hexd = entry[len(HASH_PREFIX) :].lower()
            if len(hexd) != 64 or any(c not in "0123456789abcdef" for c in hexd):
                log.warning("%s: entry %d is not sha256: and 64 hex digits; skipped", where, n)
                continue
            out.add(hexd)
        else:
            out.add(digest(entry))
    return frozenset(out)


def _lines(raw: bytes) -> list[str | None]:
    """A key file's lines; None for one that is not UTF-8 (skipped with a warning by
    `parse_keys`), so the rest of the file still counts."""
    out: list[str | None] = []
    for line in raw.splitlines():
        try:
            out.append(line.decode())
        except UnicodeDecodeError:
            out.append(None)
    return out


class KeyRing:
    """The accepted keys: fixed ones plus those of a file that may change at any time."""

    def __init__(self, keys: tuple[str, ...] = (), path: str | None = None, recheck_s: float = 1.0) -> None:
        self._fixed = parse_keys(keys)
        self._path = Path(path) if path else None
        self._recheck = recheck_s
        self._file: frozenset[str] = frozenset()
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self._reload()

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
        except (OSError, ValueError) as exc:  # unreadable: keep the last set, never lock everyone out
            log.error("could not read API_KEYS_FILE (%s); keeping %d keys", exc, len(self._file))
            return
        self._file, self._stamp = keys, stamp
        log.info("API keys loaded from file: %d", len(keys))

    def owner(self, presented: str) -> str | None:
        """The owner id of an accepted key, else None."""
        now = time.monotonic()
        if self._path is not None and now - self._checked >= self._recheck:
            self._checked = now
            self._reload()
        given = digest(presented)
        ok = False
        for accepted in self._fixed | self._file:
            ok |= hmac.compare_digest(given, accepted)
        return given[:32] if ok else None


PUBLIC_PATHS = frozenset({"/health", "/healthz", "/readyz"})
"""The only routes answered without a key: probes, which say nothing about the pool."""


class APIKeyMiddleware:
    """Every route needs a key, but for `public` (`PUBLIC_PATHS`, and the browser pages'
    static files when they are served). The path is judged as the router matches it
    (without the root path a proxy or mount strips), so no prefix gets around it."""

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
        if scheme.lower() != "bearer" and b"x-api-key" in headers:  # Anthropic's SDKs send theirs so
            header = token = headers[b"x-api-key"].decode("latin-1")
            scheme = "bearer"
        owner = self.keys.owner(token.strip()) if scheme.lower() == "bearer" else None
        if owner is not None:
            scope.setdefault("state", {})["owner"] = owner
            await self.app(scope, receive, send)
            return
        refusal = errors.INVALID_API_KEY if header else errors.MISSING_API_KEY
        error = APIError(refusal, headers={"WWW-Authenticate": "Bearer"})
        services = scope.get("state", {}).get("services")
        if services is not None:
            services.metrics.rejected.labels(error.code).inc()
        await error.response(scope)(scope, receive, send)
