"""The system packages some test groups need, and the one command that installs them all:
Debian's Redis 7.0 (the oldest server supported), Chromium and its driver (the browser pages),
Node.js and npm (the JavaScript clients), Prometheus and promtool (the alerting rules and the
dashboards' queries). Without them those groups are skipped, each saying so with this command,
and the run's summary counts them (tests/conftest.py)."""

from __future__ import annotations

import os
import shutil

import pytest

APT = "apt-get install redis-server chromium chromium-driver nodejs npm prometheus"


def missing(what: str) -> str:
    """A skip's reason: what is missing, and the command that turns every skipped group on."""
    return f"{what} not installed: `{APT}`, then scripts/test, runs every skipped group"


def prometheus_binary(name: str) -> str:
    """The path of Debian's `prometheus` or `promtool`; without it the test is skipped, or it
    fails where CI requires it (TOKENSPOOL_REQUIRE_PROMETHEUS=1, set by .ci/run)."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("TOKENSPOOL_REQUIRE_PROMETHEUS") == "1":
            raise RuntimeError(f"TOKENSPOOL_REQUIRE_PROMETHEUS=1 but {name} is not installed")
        pytest.skip(missing(name))
    return path
