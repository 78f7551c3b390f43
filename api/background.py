"""A task this API process runs beside its requests (the stream reader, the reaper), started
and stopped by the app's lifespan."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any


class Background:
    def __init__(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._name = name
        self._run = run
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
