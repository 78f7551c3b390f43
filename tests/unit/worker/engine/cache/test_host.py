"""The host tier's rules (worker/engine/cache/host.py): a scope finds only its own states, the
bound holds with the least recently used out first, and of two states where one extends the
other only the longer is kept."""

from __future__ import annotations

from worker.engine.cache.host import MAX_HOST_DIGESTS, HostTier

A, B = "scope-a", "scope-b"


def tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_a_scope_finds_only_its_own_states():
    tier = HostTier(1000)
    assert tier.put(A, tokens(0, 100), bytearray(10))
    assert tier.find(B, tokens(0, 120)) is None  # the very same prompt, another key
    kept, shared = tier.find(A, tokens(0, 120))
    assert shared == 100 and kept.scope == A
    assert tier.find("", tokens(0, 120)) is None  # no scope is not a wildcard


def test_the_same_tokens_are_kept_once_per_scope():
    tier = HostTier(1000)
    assert tier.put(A, tokens(0, 100), bytearray(10))
    assert tier.put(B, tokens(0, 100), bytearray(10))  # a second scope keeps its own copy
    assert not tier.put(A, tokens(0, 100), bytearray(10))
    assert len(tier) == 2 and tier.held == 20


def test_the_bound_holds_and_the_least_recently_used_goes_first():
    tier = HostTier(100)
    for i in range(3):
        assert tier.put(A, tokens(1000 * i, 50), bytearray(40))
    # three of 40 bytes do not fit in 100: the oldest went
    assert tier.held == 80 and tier.evictions == 1 and tier.find(A, tokens(0, 50)) is None
    assert tier.find(A, tokens(1000, 50)) is not None  # the second is now the most recent
    assert tier.put(A, tokens(3000, 50), bytearray(40))
    assert tier.find(A, tokens(2000, 50)) is None and tier.find(A, tokens(1000, 50)) is not None
    assert tier.held <= tier.bound and tier.evictions == 2


def test_a_state_larger_than_the_bound_is_not_kept_and_drops_nothing():
    tier = HostTier(100)
    assert tier.put(A, tokens(0, 10), bytearray(60))
    assert not tier.put(A, tokens(100, 10), bytearray(101))
    assert len(tier) == 1 and tier.held == 60 and tier.evictions == 0
    assert not HostTier(0).put(A, tokens(0, 10), bytearray(1))  # HOST_CACHE_MIB=0: off


def test_of_two_states_where_one_extends_the_other_the_longer_is_kept():
    tier = HostTier(1000)
    turn = tokens(0, 100)
    assert tier.put(A, turn, bytearray(10))
    # the next turn: the first one's tokens but its last (an answer re-tokenized), then more
    assert tier.put(A, [*turn[:-2], 7, 8, *tokens(500, 50)], bytearray(15))
    assert len(tier) == 1 and tier.held == 15
    assert tier.find(A, turn)[1] == 98  # the longer restores the shorter's prefix
    assert not tier.put(A, turn[:80], bytearray(8))  # a prefix of a kept state: nothing new
    assert len(tier) == 1


def test_states_that_share_a_system_prompt_and_part_are_both_kept():
    tier = HostTier(1000)
    system = tokens(0, 60)
    assert tier.put(A, [*system, *tokens(1000, 40)], bytearray(10))
    assert tier.put(A, [*system, *tokens(2000, 40)], bytearray(10))
    assert len(tier) == 2
    kept, shared = tier.find(A, [*system, *tokens(2000, 45)])
    assert shared == 100 and kept.tokens[60] == 2000


def test_of_states_sharing_as_much_the_shortest_is_restored():
    tier = HostTier(1000)
    system = tokens(0, 60)
    tier.put(A, [*system, *tokens(1000, 200)], bytearray(30))
    tier.put(A, [*system, *tokens(2000, 10)], bytearray(10))
    kept, shared = tier.find(A, [*system, 5])
    assert shared == 60 and len(kept.tokens) == 70


def test_clear_forgets_everything():
    tier = HostTier(1000)
    tier.put(A, tokens(0, 10), bytearray(10))
    tier.clear()
    assert len(tier) == 0 and tier.held == 0 and tier.find(A, tokens(0, 10)) is None


def test_a_kept_state_announces_its_digests_until_it_goes():
    tier = HostTier(25)
    turn = tokens(0, 100)
    tier.put(A, turn, bytearray(10), ("a1", "a2"))
    tier.put(B, tokens(300, 80), bytearray(10), ("b1",))
    assert tier.digests() == {"a1", "a2", "b1"}
    # the next turn replaces the first: it restores the first's prefixes as well as its own
    version = tier.version
    tier.put(A, [*turn, *tokens(500, 50)], bytearray(10), ("a3",))
    assert tier.digests() == {"a1", "a2", "a3", "b1"} and tier.version > version
    # a prefix of a kept state adds its digests to that state
    tier.put(A, turn[:80], bytearray(10), ("a0",))
    assert "a0" in tier.digests() and len(tier) == 2
    tier.put(B, tokens(900, 80), bytearray(10), ("c1",))  # over the bound: the oldest (B's) goes
    assert tier.digests() == {"a0", "a1", "a2", "a3", "c1"}
    tier.clear()
    assert tier.digests() == frozenset()


def test_the_announced_digests_are_bounded_most_recent_first():
    tier = HostTier(10**9)
    per = [f"{n}-{i}" for n in range(3) for i in range(MAX_HOST_DIGESTS // 2)]
    for n in range(3):
        tier.put(A, tokens(n * 10_000, 100), bytearray(1), tuple(d for d in per if d.startswith(f"{n}-")))
    tier.find(A, tokens(0, 100))  # the first becomes the most recent
    digests = tier.digests()
    assert len(digests) == MAX_HOST_DIGESTS
    assert {d[0] for d in digests} == {"0", "2"}
