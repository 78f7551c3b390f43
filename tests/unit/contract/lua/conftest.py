"""The job the scripts' tests run on (job.py); a file with a job of its own defines its own `r`."""

from __future__ import annotations

import fakeredis
import pytest

from tests.unit.contract.lua.job import queued


@pytest.fixture
def r() -> fakeredis.FakeRedis:
    return queued()
