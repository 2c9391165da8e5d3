"""Wall-clock timing that separates JAX compilation from execution."""

from __future__ import annotations

import contextlib
import dataclasses
import time

import jax

# The stages of turning a traced function into an executable, as jax.monitoring reports them.
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


@dataclasses.dataclass
class Timing:
    """Seconds spent in a block: in total, and tracing plus compiling inside it."""

    wall_s: float = 0.0
    compile_s: float = 0.0

    def as_dict(self, num_examples: int) -> dict:
        run_s = max(self.wall_s - self.compile_s, 1e-9)
        return {
            "wall_s": round(self.wall_s, 4),
            "compile_s": round(self.compile_s, 4),
            "images_per_s": round(num_examples / run_s, 2),
        }


@contextlib.contextmanager
def timed():
    """Yields a :class:`Timing` that is filled in when the block ends."""
    timing = Timing()

    def listener(event: str, duration: float, **_) -> None:
        if event in COMPILE_EVENTS:
            timing.compile_s += duration

    jax.monitoring.register_event_duration_secs_listener(listener)
    start = time.perf_counter()
    try:
        yield timing
    finally:
        timing.wall_s = time.perf_counter() - start
        jax.monitoring.unregister_event_duration_listener(listener)
