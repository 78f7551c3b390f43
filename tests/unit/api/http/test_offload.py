"""api/http/offload.py: heavy work runs in the lane's thread, one piece at a time; light work
stays on the event loop."""

from __future__ import annotations

import threading
import time

import anyio

from api.http.offload import HEAVY_BYTES, Lane


def test_light_work_runs_here_and_heavy_work_in_the_lane():
    async def main() -> tuple[int, int]:
        lane = Lane()
        here = await lane.run_for(100, threading.get_ident)
        there = await lane.run_for(HEAVY_BYTES + 1, threading.get_ident)
        return here, there

    here, there = anyio.run(main)
    assert here == threading.get_ident() and there != here


def test_the_lane_runs_one_piece_at_a_time_while_the_loop_goes_on():
    inside: list[int] = []
    most = 0

    def heavy() -> None:
        nonlocal most
        inside.append(1)
        most = max(most, len(inside))
        time.sleep(0.05)
        inside.pop()

    async def main() -> int:
        lane, ticks = Lane(), 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await anyio.sleep(0.005)

        async with anyio.create_task_group() as tg:
            tg.start_soon(tick)
            async with anyio.create_task_group() as pieces:
                for _ in range(4):
                    pieces.start_soon(lane.run, heavy)
            tg.cancel_scope.cancel()
        return ticks

    ticks = anyio.run(main)
    assert most == 1 and ticks > 4  # 4 pieces of 50 ms one after another; the loop ticked meanwhile
