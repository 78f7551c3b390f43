"""What the whole suite shares: a summary line counting the tests skipped for want of a
system package, with the one command that installs them (tests/system.py)."""

from __future__ import annotations

from tests.system import APT


def pytest_terminal_summary(terminalreporter) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    wanting = [r for r in skipped if APT in str(getattr(r, "longrepr", ""))]
    if wanting:
        terminalreporter.write_line(
            f"{len(wanting)} tests skipped for want of system packages: `{APT}` "
            "(as root), then scripts/test again, runs them.",
            yellow=True,
        )
