"""contract.servers: which URLs name a cluster or sentinels, and one client where the two
servers are one."""

import asyncio

import fakeredis
import pytest
import redis.asyncio.sentinel as async_sentinel
import redis.sentinel

from contract.servers import (
    BlockingSentinelPool,
    Servers,
    Target,
    async_client,
    cluster_url,
    sentinel_target,
    sync_client,
)


def test_a_cluster_url_gives_the_plain_url_its_client_is_given():
    assert cluster_url("redis+cluster://h:7000/0") == "redis://h:7000/0"
    assert (
        cluster_url("rediss+cluster://u:p@h:7000/0?ssl_ca_certs=/ca")
        == "rediss://u:p@h:7000/0?ssl_ca_certs=/ca"
    )
    for plain in ("redis://h:6379/0", "rediss://h:6380/0", "unix:///tmp/r.sock", "redis://cluster:1/0"):
        assert cluster_url(plain) is None


def test_one_server_is_one_client():
    one = fakeredis.FakeRedis()
    assert not Servers(one, one).split and Servers(one, one).each() == [one]
    other = fakeredis.FakeRedis()
    assert Servers(one, other).split and Servers(one, other).each() == [one, other]


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
    with pytest.raises(ValueError, match="names its sentinels and the primary") as exc:
        sentinel_target("redis+sentinel://u:secret@s1:26379")
    assert "secret" not in str(exc.value)  # the password stays out of the log


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
