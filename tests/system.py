"""The system packages some test groups need, and the one command that installs them all:
Debian's Redis 7.0 (the oldest server supported), Chromium and its driver (the browser pages),
Node.js and npm (the JavaScript clients). Without them those groups are skipped, each saying
so with this command, and the run's summary counts them (tests/conftest.py)."""

from __future__ import annotations

APT = "apt-get install redis-server chromium chromium-driver nodejs npm"


def missing(what: str) -> str:
    """A skip's reason: what is missing, and the command that turns every skipped group on."""
    return f"{what} not installed: `{APT}`, then scripts/test, runs every skipped group"
