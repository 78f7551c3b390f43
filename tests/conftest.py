"""What the whole suite shares: the two lanes it can run in, Hypothesis without deadlines,
and a summary line counting the tests skipped for want of a system package, with the one
command that installs them (tests/system.py)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from xdist.scheduler import LoadFileScheduling

from tests.system import APT

# Hypothesis fails an example slower than 200 ms by default: on a shared 2-core machine under
# load an example can take 600 ms, and the fuzz tests then fail for time, not for what they
# test. Speed is measured in benchmarks, never asserted in tests.
settings.register_profile("tokenspool", deadline=None)
settings.load_profile("tokenspool")


def pytest_terminal_summary(terminalreporter) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    wanting = [r for r in skipped if APT in str(getattr(r, "longrepr", ""))]
    if wanting:
        terminalreporter.write_line(
            f"{len(wanting)} tests skipped for want of system packages: `{APT}` "
            "(as root), then scripts/test again, runs them.",
            yellow=True,
        )


# Files whose tests spend most of their time waiting (for failovers, restarts, a Hub's retry
# backoff, heartbeat windows) rather than decoding: `-n 2 --dist loadfile --no-loadscope-reorder`
# runs them as one lane beside the rest (the `Lanes` scheduler below), keeping both cores busy.
# Each measured under half a core over its run (`/usr/bin/time` of each file alone).
WAITING = frozenset(
    {
        "test_acks.py",
        "test_charging.py",
        "test_devstack.py",
        "test_failover.py",
        "test_hardening.py",
        "test_hub_models.py",
        "test_outage.py",
        "test_planted_jobs.py",
        "test_publishing.py",
        "test_redis_security.py",
        "test_review_attacks.py",
        "test_scale.py",
        "test_two_servers.py",
    }
)
# Files using tests/integration/conftest.py's session-scoped stacks: one process runs them
# all, so the stacks start once (checked against the fixtures at collection).
STACKED = frozenset(
    {
        "test_bad_input.py",
        "test_custom_tools.py",
        "test_failures.py",
        "test_idempotency.py",
        "test_openai_sdk.py",
        "test_streaming.py",
    }
)


def lane(nodeid: str) -> str:
    """The unit of work a test is sent in: the waiting lane, the stacks' lane, or its file."""
    path = nodeid.split("::")[0]
    folder, _, name = path.rpartition("/")
    if folder == "tests/integration" and name in WAITING:
        return "waiting"
    if folder == "tests/integration" and name in STACKED:
        return "stacks"
    return path


class Lanes(LoadFileScheduling):
    """xdist's --dist loadfile, with the lanes above as units of work (xdist's own
    `xdist_group` marks do not take with pytest 9: the group never reaches the node id)."""

    def _split_scope(self, nodeid: str) -> str:
        return lane(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log) -> Lanes | None:
    return Lanes(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuses a file on the session stacks missing from STACKED (it would start them again
    in the other process); in a lane process, puts the waiting lane first, so that it starts
    at once and the other process works through the rest meanwhile."""
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        stack = defs.name2fixturedefs.get("stack") if defs else None
        if stack and stack[-1].scope == "session" and lane(item.nodeid) != "stacks":
            raise pytest.UsageError(
                f"{item.path.name} uses the session stacks: add it to STACKED in tests/conftest.py"
            )
    if hasattr(config, "workerinput"):  # an xdist worker: one process runs in file order
        items.sort(key=lambda item: lane(item.nodeid) != "waiting")
