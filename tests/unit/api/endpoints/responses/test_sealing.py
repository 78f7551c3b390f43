"""A sealed reasoning item opens only here and only for the key it was sealed for; a rotated
secret still opens what it sealed, and replicas that share no setting share Redis's secret."""

from __future__ import annotations

import asyncio

import fakeredis
import pytest

from api.endpoints.responses.sealing import Seals, kept_secret
from contract import keys

OWNER, OTHER = "a" * 64, "b" * 64
THOUGHT = "17 has no divisor but 1 and itself: é, 漢 and </think> are just text here."


def test_a_seal_opens_for_its_key_only():
    seals = Seals(["s" * 32])
    sealed = seals.seal(OWNER, THOUGHT)
    assert THOUGHT not in sealed and "17" not in sealed
    assert seals.open(OWNER, sealed) == THOUGHT
    assert seals.open(OTHER, sealed) is None
    assert seals.open("", sealed) is None


def test_the_same_thinking_seals_the_same_and_other_thinking_otherwise():
    seals = Seals(["s" * 32])
    assert seals.seal(OWNER, THOUGHT) == seals.seal(OWNER, THOUGHT)  # every replay, every replica
    assert seals.seal(OWNER, THOUGHT) != seals.seal(OWNER, THOUGHT + ".")
    assert seals.seal(OWNER, THOUGHT) != seals.seal(OTHER, THOUGHT)


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_a_changed_or_cut_seal_does_not_open(cut):
    seals = Seals(["s" * 32])
    sealed = seals.seal(OWNER, THOUGHT)
    flipped = sealed[:-cut] + ("A" if sealed[-cut] != "A" else "B") + sealed[len(sealed) - cut + 1 :]
    for bad in (
        flipped,
        sealed[:-cut],
        sealed + "A",
        "ts1." + sealed[4:].upper(),
        "x",
        "",
        "ts1..",
        "ts1.x.y",
    ):
        assert seals.open(OWNER, bad) is None


def test_another_deployment_s_seal_does_not_open():
    theirs = Seals(["t" * 32]).seal(OWNER, THOUGHT)
    assert Seals(["s" * 32]).open(OWNER, theirs) is None


def test_a_rotation_seals_with_the_new_secret_and_still_opens_the_old_one_s():
    old, new = Seals(["old" * 11]), Seals(["new" * 11, "old" * 11])
    before = old.seal(OWNER, THOUGHT)
    after = new.seal(OWNER, THOUGHT)
    assert after != before and new.open(OWNER, before) == THOUGHT and new.open(OWNER, after) == THOUGHT
    assert old.open(OWNER, after) is None  # a replica not yet told the new secret
    assert Seals(["new" * 11]).open(OWNER, before) is None  # the old secret dropped: its seals no more


def test_replicas_without_a_setting_share_the_secret_kept_in_redis():
    server = fakeredis.FakeServer()

    async def both() -> tuple[str, str]:
        one = fakeredis.FakeAsyncRedis(server=server)
        two = fakeredis.FakeAsyncRedis(server=server)
        return tuple(await asyncio.gather(kept_secret(one), kept_secret(two)))  # type: ignore[return-value]

    first, second = asyncio.run(both())
    assert first == second and len(first) >= 32
    assert fakeredis.FakeRedis(server=server).get(keys.REASONING_SEAL).decode() == first
    assert Seals([second]).open(OWNER, Seals([first]).seal(OWNER, THOUGHT)) == THOUGHT
