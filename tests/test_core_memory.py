"""A decision round leaves no reference cycles behind.

The simulator and the controllers run tens of thousands of rounds; a round whose working state
(its overlays, indexes and demand queue) forms a cycle is freed only by the cyclic garbage
collector, which then scans every live snapshot again and again (at 16,384 nodes with the
collector off, a 30-day simulation grew past 800 MB).
"""

from __future__ import annotations

import gc

from builders import World, create, fail


def test_rounds_that_serve_demands_leave_no_garbage_cycles() -> None:
    world = World(slices=6)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds is kept in gc.garbage to be read
    try:
        # Admission, preemption, a hotswap and a completion: every path through the demand queue.
        world.step(create("low", 3, "low"), create("mid", 2, "medium"))
        world.step(create("high", 3, "high"))
        world.step(fail(0))
        world.finish("high")
        gc.collect()
        left = {type(o).__name__ for o in gc.garbage if type(o).__module__.startswith("hotswap.core")}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not left, left
