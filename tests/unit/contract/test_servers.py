"""contract.servers: which URLs name a cluster, and one client where the two servers are one."""

import fakeredis

from contract.servers import (
    Servers,
    cluster_url,
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
