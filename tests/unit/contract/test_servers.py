"""contract.servers: which URLs name a cluster, one client where the two servers are one, and
which clients follow the sentinels."""

import fakeredis

from contract.servers import (
    Servers,
    async_client,
    cluster_url,
    is_sentinel,
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


def test_a_client_of_the_sentinels_primary_is_told_from_the_others():
    """Only it can ask the sentinels which server is the primary now (a claim's and a new
    job's confirmation do, after a failover)."""
    assert is_sentinel(sync_client("redis+sentinel://s:26379/m"))
    assert is_sentinel(async_client("redis+sentinel://s:26379/m", blocking=True))
    assert not is_sentinel(sync_client("redis://h:6379/0"))
    assert not is_sentinel(fakeredis.FakeRedis())
