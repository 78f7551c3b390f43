"""contract.failover: sentinel URLs, and clients whose connections take a demoted primary's
answers for a lost connection (tests/integration/test_failover.py fails over for real)."""

import asyncio

import pytest
import redis
import redis.asyncio.sentinel as async_sentinel
import redis.sentinel
from redis.exceptions import ExecAbortError, ReadOnlyError, ResponseError

from contract import failover
from contract.failover import BlockingSentinelPool, Target, sentinel_target
from contract.servers import async_client, sync_client


def test_a_sentinel_url_names_the_sentinels_the_primary_and_both_auths():
    assert sentinel_target("redis+sentinel://s1:26379,s2:26380,s3/mymaster") == Target(
        [("s1", 26379), ("s2", 26380), ("s3", 26379)], "mymaster"
    )
    t = sentinel_target("rediss+sentinel://app:p%40ss@[::1]:26379/main/2?sentinel_password=sp")
    assert t == Target(
        [("::1", 26379)], "main", 2, True, {"username": "app", "password": "p@ss"}, {"password": "sp"}
    )
    assert sentinel_target("redis+sentinel://:pw@s1:1/m?ssl=true").client_kwargs(socket_timeout=5) == {
        "db": 0,
        "password": "pw",
        "ssl": True,
        "socket_timeout": 5,
    }
    assert t.sentinel_kwargs(socket_timeout=5, client_name="x") == {
        "socket_timeout": 5,
        "password": "sp",
        "ssl": True,
    }
    assert sentinel_target("redis+sentinel://[::1]/m").sentinels == [("::1", 26379)]
    tls = sentinel_target("redis+sentinel://s/m?ssl=true&ssl_ca_certs=/ca.crt&ssl_check_hostname=false")
    assert (
        tls.client_kwargs()["ssl_ca_certs"] == "/ca.crt"
        and tls.sentinel_kwargs()["ssl_check_hostname"] is False
    )
    for other in ("redis://h:6379/0", "redis+cluster://h:7000/0"):
        assert sentinel_target(other) is None
    assert sentinel_target("redis+sentinel://s/m?sentinel_password=a+b%2Fc").sentinel_auth == {
        "password": "a+b/c"
    }
    assert "secret" not in repr(sentinel_target("redis+sentinel://:secret@s/m?sentinel_password=secret"))


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://u:secret@s1:26379",  # no primary named
        "redis+sentinel://u:se/cret@s1:26379/m",  # a raw "/" in the password
        "redis+sentinel://s1,,s2/m?sentinel_password=secret",  # an empty host
        "redis+sentinel://s1:26379/m/x?sentinel_password=secret",  # not a db
    ],
)
def test_a_wrong_sentinel_url_is_refused_without_its_secrets(url):
    with pytest.raises(ValueError, match="a sentinel URL is redis") as exc:
        sentinel_target(url)
    assert "secret" not in str(exc.value) and "cret" not in str(exc.value)


def test_a_sentinel_url_refuses_options_it_would_ignore():
    with pytest.raises(ValueError, match="takes no option db, socket_timeout"):
        sentinel_target("redis+sentinel://s/m?db=3&socket_timeout=1")


@pytest.mark.parametrize(
    "query",
    [
        "ssl_ca_certs=/ca.crt",
        "ssl=false&ssl_cert_reqs=required",
        "ssl=maybe",
        "ssl=true&ssl_check_hostname=perhaps",
    ],
)
def test_tls_options_that_would_not_apply_are_refused_not_dropped(query):
    # without ssl=true the connection would be plain text beside options that say otherwise
    with pytest.raises(ValueError, match="ssl"):
        sentinel_target(f"redis+sentinel://:secret@s/m?{query}")


def test_a_sentinel_url_gives_clients_that_ask_the_sentinels_for_the_primary():
    url = "redis+sentinel://s1:26379,s2:26379/mymaster"
    sync = sync_client(url, socket_timeout=2)
    assert isinstance(sync.connection_pool, redis.sentinel.SentinelConnectionPool)
    assert sync.connection_pool.service_name == "mymaster"

    async def pools() -> tuple:
        pooled = async_client(url, blocking=True, max_connections=7, timeout=1)
        single = async_client(url, single_connection_client=True)
        return pooled.connection_pool, single

    pooled, single = asyncio.run(pools())
    assert isinstance(pooled, BlockingSentinelPool) and pooled.max_connections == 7 and pooled.timeout == 1
    assert (
        isinstance(single.connection_pool, async_sentinel.SentinelConnectionPool)
        and single.single_connection_client
    )


def test_a_demoted_primary_s_answers_are_told_from_a_wrong_command():
    assert failover.demoted(ReadOnlyError("You can't write against a read only replica."))
    assert failover.demoted(
        ResponseError(
            "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)"
        )
    )
    assert failover.demoted(
        ExecAbortError(
            "Transaction discarded because of: READONLY You can't write against a read only replica."
        )
    )
    # a claim's WAIT reaching the demoted primary behind one name (a failover test, once)
    assert failover.demoted(
        ResponseError(
            "WAIT cannot be used with replica instances. Please also note that if a replica is "
            "configured to be writable (which is not the default) writes to replicas are just "
            "local and are not propagated."
        )
    )
    assert not failover.demoted(ExecAbortError("Transaction discarded because of previous errors."))
    assert not failover.demoted(
        ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    )
    assert not failover.demoted(ResponseError("UNBLOCKED client unblocked via CLIENT UNBLOCK"))


def test_every_kind_of_url_gives_connections_that_follow_a_failover():
    assert sync_client("redis://h:6379/0").connection_pool.connection_class is failover.Connection
    assert sync_client("rediss://h:6380/0").connection_pool.connection_class is failover.SSLConnection
    assert (
        sync_client("unix:///tmp/r.sock").connection_pool.connection_class is redis.UnixDomainSocketConnection
    )
    assert sync_client("redis+sentinel://s/m").connection_pool.connection_class is failover.SentinelConnection
    assert (
        sync_client("redis+sentinel://s/m?ssl=true").connection_pool.connection_class
        is failover.SentinelSSLConnection
    )

    async def kinds() -> list[type]:
        urls = ("redis://h/0", "rediss://h/0", "redis+sentinel://s/m", "rediss+sentinel://s/m")
        return [async_client(url, blocking=True).connection_pool.connection_class for url in urls]

    assert asyncio.run(kinds()) == [
        failover.AsyncConnection,
        failover.AsyncSSLConnection,
        failover.AsyncSentinelConnection,
        failover.AsyncSentinelSSLConnection,
    ]


class _Answers:
    """A connection's parent that answers with what a test gives it."""

    def __init__(self, answer: object) -> None:
        self.answer, self.closed = answer, False

    def read_response(self, *args, **kwargs) -> object:
        return self.answer

    def disconnect(self, *args, **kwargs) -> None:
        self.closed = True


class _Sync(failover.Demotable, _Answers):
    pass


def test_a_transaction_whose_script_a_demoted_primary_refused_is_a_lost_connection():
    """EXEC answers a script's READONLY inside its array (the script was queued, its write
    refused when it ran): a reply redis-py returns rather than raises, so it must not reach
    the caller as the script's own error."""
    refused = ReadOnlyError("You can't write against a read only replica. script: on @user_script:101.")
    conn = _Sync([[b"0", b"1-0"], refused])
    with pytest.raises(redis.ConnectionError, match="demoted"):
        conn.read_response()
    assert conn.closed
    fine = _Sync([b"OK", ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")])
    assert fine.read_response() == fine.answer and not fine.closed


class _ClosedUnderTheWrite:
    """An asyncio connection's parent whose transport the server closed: uvloop raises
    RuntimeError, not an OSError that redis-py would make a ConnectionError."""

    def __init__(self) -> None:
        self.closed = False

    async def send_packed_command(self, *args, **kwargs) -> None:
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")

    async def disconnect(self, *args, **kwargs) -> None:
        self.closed = True


class _Async(failover.AsyncDemotable, _ClosedUnderTheWrite):
    pass


def test_a_write_to_a_transport_closed_under_it_is_a_lost_connection():
    """A relay whose reconnect met a restarting primary's closed socket (uvloop's
    RuntimeError during HELLO) ended its stream with internal_error (chaos, SLOTS=4)."""
    conn = _Async()
    with pytest.raises(redis.ConnectionError, match="closed"):
        asyncio.run(conn.send_packed_command(b"HELLO"))
    assert conn.closed
