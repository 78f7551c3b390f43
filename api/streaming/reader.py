"""One Redis connection that watches every open stream of this API process.

A blocking XREAD per client would pin one connection per open stream (redis-py 8's pool
holds 100). Instead one reader task blocks in a single XREAD over all watched streams. It
hands what it read to the clients waiting on those streams. A client that is waiting has
sent everything up to its cursor. So when its cursor is where the reader's read began, the
entries read are exactly its next ones. It then needs no read of its own. Any other client
is only woken: a slow one, one busy sending, or one with an older cursor. It reads its own
entries with XRANGE from its cursor, on the shared pool. So nothing piles up here. A slow
client's backlog stays in Redis, and a client's cursor is all it needs to resume.

The reader also watches a control stream of its own. Adding a stream to the watch set writes
to it. So the blocked XREAD returns at once, and no wake-up is lost to a race.

On a Redis Cluster (a `redis+cluster://` STREAMS_REDIS_URL), one XREAD may only name keys of
one slot. So there is one reader per shard (contract/keys.py), started with the shard's first
watched stream. Each blocks on a plain connection of its own to the shard's node. The slot
map comes from the shared cluster client. It is read again after a reader loses its node: a
failover, a slot moved. On one server a single reader reads every shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum

import redis.asyncio as aredis
from redis.exceptions import AskError, ClusterDownError, MovedError, RedisError, ResponseError, TryAgainError

from api.tasks import Background
from contract import entries, keys
from contract.entries import Rows
from contract.servers import async_client, cluster_url, node_url

log = logging.getLogger(__name__)

# What a cluster node answers when it no longer holds (or cannot yet serve) a slot.
REDIRECTED = (MovedError, AskError, ClusterDownError, TryAgainError)


def stream_id(value: str) -> tuple[int, int]:
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)


class WakeReason(Enum):
    """Why a wait ended without entries handed over."""

    # the stream may hold entries after the cursor: read them yourself
    READY = "ready"
    TIMED_OUT = "timed out"


@dataclass(frozen=True)
class Delivery:
    """The reader read exactly the entries after the waiter's cursor: here they are."""

    rows: Rows


Wake = Delivery | WakeReason


@dataclass
class _Watched:
    # the newest entry id the reader has seen (or the first watcher's cursor)
    seen: str
    watchers: int = 0
    # Redis refused to read this stream: its watchers get it
    error: Exception | None = None
    # waiting clients: their future -> their cursor; the reader resolves it with what it
    # read for them, or None (read yourself)
    waiters: dict[asyncio.Future[Rows | None], str] = field(default_factory=dict)


class StreamReader:
    """Routes each watched stream to the reader of its shard (one reader on one server)."""

    def __init__(self, url: str, client: aredis.Redis, block_ms: int = 1000) -> None:
        self._url = url
        # the shared pool (on a cluster: the cluster client), for control writes
        self._client = client
        self._block_ms = block_ms
        self._process = uuid.uuid4().hex
        self._sharded = cluster_url(url) is not None
        self._readers: dict[int, _GroupReader] = {}
        self._started = False
        self._topology = asyncio.Lock()
        # monotonic: when the slot map was last read again
        self._mapped_at = 0.0

    async def start(self) -> None:
        self._started = True
        if not self._sharded:
            self._reader(0)

    async def stop(self) -> None:
        self._started = False
        readers, self._readers = list(self._readers.values()), {}
        for reader in readers:
            await reader.stop()

    @property
    def watched(self) -> int:
        return sum(len(r.watched) for r in self._readers.values())

    def _reader(self, group: int) -> _GroupReader:
        reader = self._readers.get(group)
        if reader is None:
            control = keys.hub_control(self._process, group)
            reader = self._readers[group] = _GroupReader(
                self._client, control, self._block_ms, self._connect, self._lost
            )
            if self._started:
                reader.start()
        return reader

    async def _connect(self, control: str) -> aredis.Redis:
        """A connection of its own for a reader. It goes to the server, or to the node
        holding the reader's shard."""
        url = self._url
        if self._sharded:
            await self._client.initialize()  # type: ignore[attr-defined]  # once: the slot map
            node = self._client.get_node_from_key(control)  # type: ignore[attr-defined]
            url = node_url(url, node.host, node.port)
        return async_client(url, single_connection_client=True, socket_timeout=self._block_ms / 1000 + 5)

    async def _lost(self) -> None:
        """A reader lost its connection. On a cluster its shard may have moved (a failover),
        so the slot map is read again. It is read once for every reader that lost it at the
        same time."""
        if not self._sharded:
            return
        async with self._topology:
            if time.monotonic() - self._mapped_at < 0.5:
                return
            with contextlib.suppress(RedisError, OSError):
                await self._client.nodes_manager.initialize()  # type: ignore[attr-defined]
            self._mapped_at = time.monotonic()

    @contextlib.asynccontextmanager
    async def watch(self, key: str, cursor: str) -> AsyncIterator[Watch]:
        """Watch `key` for entries after `cursor` while the context is open."""
        reader = self._reader(keys.shard_of_key(key) if self._sharded else 0)
        async with reader.watch(key, cursor) as watch:
            yield watch


class _GroupReader:
    """One blocking XREAD, on a connection of its own, over a set of streams and a control
    stream. The set is every shard's streams, or one shard's. The control stream is in the
    same slot."""

    def __init__(
        self,
        client: aredis.Redis,
        control: str,
        block_ms: int,
        connect: Callable[[str], Awaitable[aredis.Redis]],
        lost: Callable[[], Awaitable[None]],
    ) -> None:
        # the shared pool, for control writes
        self._client = client
        self._control = control
        self._block_ms = block_ms
        self._connect = connect
        self._lost = lost
        self.watched: dict[str, _Watched] = {}
        self._task = Background("stream-reader", self._run)
        # A poke is on its way and the reader has not begun a new XREAD since: a stream
        # added now is picked up by that XREAD, so a burst of new streams costs one poke.
        self._poked = False

    def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()
        # Redis may be gone: never wait on it
        with contextlib.suppress(RedisError, TimeoutError):
            await asyncio.wait_for(self._client.delete(self._control), 2.0)

    @contextlib.asynccontextmanager
    async def watch(self, key: str, cursor: str) -> AsyncIterator[Watch]:
        state = self.watched.get(key)
        if state is None:
            state = self.watched[key] = _Watched(seen=cursor)
            await self._poke()
        state.watchers += 1
        try:
            yield Watch(state)
        finally:
            state.watchers -= 1
            if state.watchers == 0:
                self.watched.pop(key, None)

    async def _poke(self) -> None:
        if self._poked:
            return
        self._poked = True
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.xadd(self._control, {"w": "1"}, maxlen=16, approximate=False)
                pipe.expire(self._control, 3600)
                await pipe.execute()
        # the reader also wakes on its timeout
        except RedisError as exc:
            log.warning("could not poke stream reader: %s", exc)

    async def _run(self) -> None:
        backoff = 0.1
        control_seen = "0"
        reader: aredis.Redis | None = None
        while True:
            try:
                if reader is None:
                    reader = await self._connect(self._control)
                    last = await reader.xrevrange(self._control, count=1)
                    control_seen = last[0][0].decode() if last else "0"
                self._poked = False
                streams = {k: w.seen for k, w in self.watched.items() if w.error is None}
                streams[self._control] = control_seen
                result = await reader.xread(streams, count=64, block=self._block_ms)
                backoff = 0.1
                control_seen = self._dispatch(result, control_seen)
            except asyncio.CancelledError:
                if reader is not None:
                    await reader.aclose()
                raise
            # on a cluster: the shard's slot is served elsewhere now
            except REDIRECTED as exc:
                log.warning("stream reader's node no longer serves its shard (%s); finding it again", exc)
                with contextlib.suppress(Exception):
                    await reader.aclose()  # type: ignore[union-attr]
                reader = None
                await self._lost()
                self._wake_all()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            # one stream's arguments, most likely: not an outage
            except ResponseError as exc:
                log.error("the stream reader's XREAD was refused (%s): finding the stream at fault", exc)
                # none at fault: wait as for an outage
                if not await self._isolate(reader):
                    self._wake_all()
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                continue
            except (RedisError, OSError) as exc:
                log.warning("stream reader lost Redis (%s); retrying in %.1fs", exc, backoff)
                if reader is not None:
                    with contextlib.suppress(Exception):
                        await reader.aclose()
                reader = None
                await self._lost()
                # clients fall back to reading and endpoint the outage
                self._wake_all()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            # a bug must not end the reader silently for every stream
            except Exception:
                log.exception("stream reader failed; starting again")
                self._wake_all()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue

    def _dispatch(self, result: list, control_seen: str) -> str:
        """Hand what one XREAD returned to each stream's waiting clients. Returns the newest
        control entry seen. Rows that cannot be decoded wake that stream's clients to read it
        themselves. The scripts write no such rows. The error is then theirs alone."""
        for raw_key, rows in result or []:
            key = raw_key.decode()
            newest = rows[-1][0].decode()
            if key == self._control:
                control_seen = newest
                continue
            state = self.watched.get(key)
            if state is None:
                continue
            read_from, state.seen = state.seen, newest
            try:
                decoded: Rows | None = [
                    (eid.decode(), entries.decode(fields, token_ids=False)) for eid, fields in rows
                ]
            except Exception:
                log.exception("stream %s has entries that cannot be decoded", key)
                decoded = None
            for fut, cursor in state.waiters.items():
                if not fut.done():
                    fut.set_result(decoded if decoded is not None and cursor == read_from else None)
            state.waiters.clear()
        return control_seen

    async def _isolate(self, reader: aredis.Redis | None) -> int:
        """Read each watched stream alone once. The ones Redis refuses are taken out of the
        shared read, and their watchers get the error. The others go on as before. Returns
        how many were taken out."""
        isolated = 0
        for key, state in list(self.watched.items()):
            try:
                if reader is not None and state.error is None:
                    await reader.xread({key: state.seen}, count=1)
            except ResponseError as exc:
                log.error("stream %s cannot be read from %r: %s", key, state.seen[:64], exc)
                state.error = exc
                isolated += 1
                for fut in state.waiters:
                    if not fut.done():
                        fut.set_result(None)
                state.waiters.clear()
        return isolated

    def _wake_all(self) -> None:
        for state in self.watched.values():
            for fut in state.waiters:
                if not fut.done():
                    fut.set_result(None)
            state.waiters.clear()


class Watch:
    def __init__(self, state: _Watched) -> None:
        self._state = state

    async def wait(self, cursor: str, timeout: float) -> Wake:
        """Wait up to `timeout` for entries after `cursor`. If Redis refuses to read this
        stream, it raises what Redis answered."""
        state = self._state
        if state.error is not None:
            raise state.error
        if stream_id(state.seen) > stream_id(cursor):
            return WakeReason.READY
        fut: asyncio.Future[Rows | None] = asyncio.get_running_loop().create_future()
        state.waiters[fut] = cursor
        try:
            rows = await asyncio.wait_for(fut, timeout=max(timeout, 0.0))
        except TimeoutError:
            return WakeReason.TIMED_OUT
        finally:
            state.waiters.pop(fut, None)
        if state.error is not None:
            raise state.error
        return Delivery(rows) if rows else WakeReason.READY
