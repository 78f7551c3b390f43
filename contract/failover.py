"""Following a Redis primary through a failover, where a replica is promoted.

It is the one way every client of contract/servers.py connects.

- **Sentinel.** `redis+sentinel://[user:password@]host1:26379,host2:26379/<master name>[/db]`
  names the sentinels. `rediss+sentinel://` or `?ssl=true` means TLS, with redis-py's `ssl_*`
  options. `sentinel_username` and `sentinel_password` are the sentinels' own auth. A
  connection asks the sentinels where the primary is. It asks each time it opens (redis-py's
  sentinel pools).
- **One name** (a managed Redis: ElastiCache, Memorystore, Azure Cache). The name moves to the
  promoted replica. Connections opened before still reach the old primary, now a replica. It
  answers writes with `READONLY`, and a transaction's queued script gets it inside EXEC's
  array. It answers `WAIT` with "cannot be used with replica instances". It ends blocked
  reads (BLPOP, XREAD BLOCK) with `UNBLOCKED ... (master -> replica?)`. All mean "reconnect",
  not "your command is wrong". `Demotable` connections drop themselves and raise
  ConnectionError. The clients' retries and the processes' outage handling already ride that
  out. They reconnect to whatever the name (or the sentinels) say is the primary now. Behind
  one name, a pooled connection that happens to only read keeps reading the demoted node. It
  does so until it writes, errs or is closed. A sentinel pool drops it when it is given back.
  Until its resync ends, that node answers from its own data. A resync takes seconds: a
  primary delays a full sync by `repl-diskless-sync-delay`, 5 s by default. That node's data
  lacks what the new primary took since, and may hold what it lost. So a decision that ends
  or drops work is never made from a read alone. It is checked again where it is written, or
  read by a script only a primary runs (docs/protocol.md, "Failover").

A promoted replica may lack the primary's last writes. What that means for jobs and streams
is not handled here.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio as aredis
import redis.asyncio.connection as async_connection
import redis.asyncio.retry as async_retry
import redis.asyncio.sentinel as async_sentinel
import redis.connection
import redis.retry
import redis.sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ExecAbortError, ReadOnlyError, ResponseError


def demoted(exc: ResponseError) -> bool:
    """The server that answered is a replica now.

    It refused a write, alone or a transaction's (which EXEC then aborts). Or it ended a
    blocked read, or refused a `WAIT`. After a script that happened to write nothing, a
    replica answers only the WAIT with an error."""
    text = str(exc)
    return (
        isinstance(exc, ReadOnlyError)
        or (isinstance(exc, ExecAbortError) and "READONLY" in text)
        or "instance state changed (master -> replica" in text
        or text.startswith("WAIT cannot be used with replica instances")
    )


def _reconnect(exc: ResponseError) -> redis.ConnectionError:
    return redis.ConnectionError(f"the primary was demoted (a failover), reconnecting: {exc}")


def _refused_inside(answer: Any) -> ResponseError | None:
    """A demoted primary's refusal inside an EXEC's array.

    The replica refused a queued script's write when the script ran. (redis-py returns such a
    reply rather than raise it.)"""
    if isinstance(answer, list):
        for item in answer:
            if isinstance(item, ResponseError) and demoted(item):
                return item
    return None


class Demotable:
    """A sync connection that treats a demoted primary's answers as a lost connection."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            answer = super().read_response(*args, **kwargs)  # type: ignore[misc]
        except ResponseError as exc:
            if not demoted(exc):
                raise
            self.disconnect()  # type: ignore[attr-defined]
            raise _reconnect(exc) from exc
        if (refused := _refused_inside(answer)) is not None:
            self.disconnect()  # type: ignore[attr-defined]
            raise _reconnect(refused) from refused
        return answer


class AsyncDemotable:
    """`Demotable` for asyncio connections.

    A write to a transport the server closed under it is a lost connection too. (uvloop
    raises RuntimeError there, which redis-py does not make a ConnectionError.)"""

    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().send_packed_command(*args, **kwargs)  # type: ignore[misc]
        except RuntimeError as exc:
            if "closed" not in str(exc):
                raise
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise redis.ConnectionError(f"the connection closed under a write: {exc}") from exc

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            answer = await super().read_response(*args, **kwargs)  # type: ignore[misc]
        except ResponseError as exc:
            if not demoted(exc):
                raise
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]  # as redis-py's own error path
            raise _reconnect(exc) from exc
        if (refused := _refused_inside(answer)) is not None:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise _reconnect(refused) from refused
        return answer


class Connection(Demotable, redis.connection.Connection):
    pass


class SSLConnection(Demotable, redis.connection.SSLConnection):
    pass


class SentinelConnection(Demotable, redis.sentinel.SentinelManagedConnection):
    pass


class SentinelSSLConnection(Demotable, redis.sentinel.SentinelManagedSSLConnection):
    pass


class AsyncConnection(AsyncDemotable, async_connection.Connection):
    pass


class AsyncSSLConnection(AsyncDemotable, async_connection.SSLConnection):
    pass


class AsyncSentinelConnection(AsyncDemotable, async_sentinel.SentinelManagedConnection):
    pass


class AsyncSentinelSSLConnection(AsyncDemotable, async_sentinel.SentinelManagedSSLConnection):
    pass


_SYNC = {redis.connection.Connection: Connection, redis.connection.SSLConnection: SSLConnection}
_ASYNC = {async_connection.Connection: AsyncConnection, async_connection.SSLConnection: AsyncSSLConnection}


_SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")


@dataclass(frozen=True)
class Target:
    """A `redis+sentinel://` URL.

    It says where the sentinels are, which primary they watch, and how to speak to both."""

    sentinels: list[tuple[str, int]]
    master: str
    db: int = 0
    ssl: bool = False
    # the primary's username, password
    auth: dict[str, str] = field(default_factory=dict, repr=False)
    # the sentinels'
    sentinel_auth: dict[str, str] = field(default_factory=dict, repr=False)
    # ssl_ca_certs and the like, for both
    tls: dict[str, str | bool] = field(default_factory=dict)

    def _tls(self) -> dict[str, Any]:
        return {"ssl": True, **self.tls} if self.ssl else {}

    def sentinel_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        """The sentinels' connections.

        They get the sockets' timeouts of the data connections, TLS if those use it, and the
        sentinels' own auth. The pools add a `retry` of none. A sentinel that fails is
        followed by the next. With every one down, the caller is told at once. (redis-py's
        default retries and backoff on each made a request wait 16-48 s for its 503.)"""
        out = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
        return {**out, **self.sentinel_auth, **self._tls()}

    def client_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        return {"db": self.db, **self.auth, **self._tls(), **kwargs}


def sentinel_target(url: str) -> Target | None:
    """The `Target` of a `redis+sentinel://` URL (`rediss+sentinel://`: TLS).

    None for any other URL."""
    if not url.startswith(_SENTINEL_SCHEMES):
        return None
    # The message names no part of the URL: a password with a raw "/", "?" or "#" in it
    # would be cut anywhere, and the query holds the sentinels' password.
    wrong = ValueError(
        "a sentinel URL is redis+sentinel://[user:password@]host[:port],.../<master name>[/db]"
        "[?ssl=true&ssl_*=...&sentinel_username=...&sentinel_password=...] (a password's "
        "reserved characters %-encoded)"
    )
    try:
        parts = urlsplit(url)
        userinfo, _, hosts = parts.netloc.rpartition("@")
        user, _, password = userinfo.partition(":")
        sentinels = []
        for node in hosts.split(","):
            # no port, or a bare [v6] address
            bare = ":" not in node or node.endswith("]")
            host, _, port = (node, "", "26379") if bare else node.rpartition(":")
            if not host.strip("[]"):
                raise wrong
            sentinels.append((host.strip("[]"), int(port)))
        path = [p for p in parts.path.split("/") if p]
        # "+" is a plus, as in the user info (parse_qs would read a space)
        query = {k: v[-1] for k, v in parse_qs(parts.query.replace("+", "%2B")).items()}
    except ValueError:
        raise wrong from None
    if not path or len(path) > 2 or (not path[-1].isdigit() and len(path) == 2):
        raise wrong
    if unknown := set(query) - _QUERY - {k for k in query if k.startswith("ssl_")}:
        raise ValueError(f"a sentinel URL takes no option {', '.join(sorted(unknown))}")
    flags = {"true": True, "false": False}
    ssl = url.startswith("rediss+") or _flag(query.get("ssl", "false"), "ssl")
    tls = {k: flags.get(v.lower(), v) for k, v in query.items() if k.startswith("ssl_")}
    # dropped, the connection would be plain text (redis:// refuses them too)
    if tls and not ssl:
        raise ValueError(f"{', '.join(sorted(tls))} need TLS: add ssl=true, or use rediss+sentinel://")
    if isinstance(tls.get("ssl_check_hostname", False), str):
        raise ValueError("ssl_check_hostname is true or false")
    return Target(
        sentinels=sentinels,
        master=unquote(path[0]),
        db=int(path[1]) if len(path) > 1 else 0,
        ssl=ssl,
        auth={k: unquote(v) for k, v in (("username", user), ("password", password)) if v},
        sentinel_auth={k[len("sentinel_") :]: query[k] for k in _SENTINEL_AUTH if k in query},
        tls=tls,
    )


def _flag(value: str, name: str) -> bool:
    if value.lower() in ("1", "true", "yes"):
        return True
    if value.lower() in ("0", "false", "no"):
        return False
    raise ValueError(f"{name} is true or false")


_SENTINEL_AUTH = ("sentinel_username", "sentinel_password")
_QUERY = {"ssl", *_SENTINEL_AUTH}


def pool(url: str, **kwargs: Any) -> redis.ConnectionPool:
    """A sync pool of one server's URL whose connections follow a failover (`Demotable`).

    A unix socket's connections are left as they are."""
    made = redis.ConnectionPool.from_url(url, **kwargs)
    made.connection_class = _SYNC.get(made.connection_class, made.connection_class)
    return made


def async_pool(url: str, blocking: bool, **kwargs: Any) -> aredis.ConnectionPool:
    """`pool` for asyncio.

    With `blocking`, a command waits for a free connection (`max_connections`, `timeout`)
    rather than failing."""
    kind = aredis.BlockingConnectionPool if blocking else aredis.ConnectionPool
    made = kind.from_url(url, **kwargs)
    made.connection_class = _ASYNC.get(made.connection_class, made.connection_class)
    return made


# How often a sentinel pool asks the sentinels which server is the primary. A primary that
# the sentinels have replaced goes on taking writes until they reach it and demote it (after
# a SENTINEL FAILOVER, up to ten seconds later), and every write it takes then is lost: so
# the pool does not wait for an error to move, it looks.
ASK_EVERY_S = 1.0


class SentinelPool(redis.sentinel.SentinelConnectionPool):
    """redis-py's sync sentinel pool, asking the sentinels for the primary every `ASK_EVERY_S`.

    It does not ask only when a connection fails. A connection to a replaced primary is closed
    before it is used. It then reconnects to the new one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._asked_at = time.monotonic()

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if time.monotonic() - self._asked_at >= ASK_EVERY_S:
            self._asked_at = time.monotonic()
            # no answer: the connection's error says why
            with contextlib.suppress(redis.RedisError):
                self.get_master_address()
        connection = super().get_connection(*args, **kwargs)
        if _stale(connection, self.master_address):
            connection.disconnect()
        return connection


def _stale(connection: Any, master: tuple[str, int] | None) -> bool:
    """Connected, but to a server that is no longer the primary."""
    return master is not None and connection.is_connected and (connection.host, connection.port) != master


def sentinel_pool(target: Target, **kwargs: Any) -> redis.sentinel.SentinelConnectionPool:
    """A sync pool of the sentinels' current primary."""
    asked = target.sentinel_kwargs(**kwargs)
    once = {"retry": redis.retry.Retry(NoBackoff(), 0)}
    sentinels = redis.sentinel.Sentinel(target.sentinels, sentinel_kwargs=asked | once)
    kind = SentinelSSLConnection if target.ssl else SentinelConnection
    return SentinelPool(
        target.master, sentinels, is_master=True, connection_class=kind, **target.client_kwargs(**kwargs)
    )


class AsyncSentinelPool(async_sentinel.SentinelConnectionPool):
    """redis-py's asyncio sentinel pool, made to do what its sync one does.

    A connection given back while it points at an old primary is dropped. It reconnects to
    the new one when next used. So connections that only read do not stay on a demoted
    primary. As `SentinelPool` does, it asks the sentinels for the primary every
    `ASK_EVERY_S`. Closing the pool closes its connections to the sentinels too."""

    _asked_at = 0.0

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if time.monotonic() - self._asked_at >= ASK_EVERY_S:
            self._asked_at = time.monotonic()
            with contextlib.suppress(redis.RedisError):
                await self.get_master_address()
        connection = await super().get_connection(*args, **kwargs)
        if _stale(connection, self.master_address):
            await connection.disconnect()
        return connection

    async def release(self, connection: Any) -> None:
        if self.master_address is not None and (connection.host, connection.port) != self.master_address:
            await connection.disconnect()
        await super().release(connection)

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        # the pool is closed (a new primary's address drops only idle ones)
        if inuse_connections:
            await self.sentinel_manager.aclose()


class BlockingSentinelPool(AsyncSentinelPool, aredis.BlockingConnectionPool):
    """The sentinels' primary, with a pool that makes a command wait for a free connection.

    The command does not fail. (api/services.py's pool does the same.)"""


def async_sentinel_pool(
    target: Target, blocking: bool, **kwargs: Any
) -> async_sentinel.SentinelConnectionPool:
    """`sentinel_pool` for asyncio; `blocking` as in `async_pool`."""
    asked = target.sentinel_kwargs(**kwargs)
    once = {"retry": async_retry.Retry(NoBackoff(), 0)}
    sentinels = async_sentinel.Sentinel(target.sentinels, sentinel_kwargs=asked | once)
    kind = BlockingSentinelPool if blocking else AsyncSentinelPool
    connection = AsyncSentinelSSLConnection if target.ssl else AsyncSentinelConnection
    return kind(
        target.master,
        sentinels,
        is_master=True,
        connection_class=connection,
        **target.client_kwargs(**kwargs),
    )
