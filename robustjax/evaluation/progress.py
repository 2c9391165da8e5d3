"""Progress of an evaluation's long steps, reported through a callback (library code never
prints; ``robustjax.cli.progress`` draws it).

A step is one item of a plan (the clean pass, an ``[[attacks]]`` entry, a corruption at all
its severities, a sequence perturbation, the system noise, the metrics, the sanity checks)
with a name and a total of units, mostly batches. ``on_step`` receives a :class:`StepEvent`
when the step starts (``done`` 0), after each unit, and when it ends: ``finished``,
``failed`` (it raised), ``interrupted`` (Ctrl-C), or ``reused`` (no unit ran: its result was
read back from the item store, so it counts as done at once).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Literal, TypeVar

T = TypeVar("T")
Status = Literal["running", "finished", "failed", "interrupted", "reused"]


@dataclasses.dataclass(frozen=True)
class StepEvent:
    """``done`` of ``total`` units (``unit``: "batches", "checks") of step ``step``;
    ``status`` is "running" until it ends."""

    step: str
    done: int
    total: int
    status: Status = "running"
    unit: str = "batches"


OnStep = Callable[[StepEvent], None]


def ignore(event: StepEvent) -> None:
    """The default ``on_step``: no progress is reported."""


class Step:
    """A running step: ``advance`` after each unit, or ``track`` an iterable of units."""

    def __init__(self, name: str, total: int, on_step: OnStep, unit: str = "batches"):
        self.name, self.total, self.unit, self.done, self._on_step = name, total, unit, 0, on_step

    def report(self, status: Status = "running") -> None:
        self._on_step(StepEvent(self.name, self.done, self.total, status, self.unit))

    def advance(self, units: int = 1) -> None:
        self.done += units
        self.report()

    def expect(self, total: int) -> None:
        """Sets the total, for a step that learns it once it has started."""
        self.total = total
        self.report()

    def track(self, units: Iterable[T]) -> Iterator[T]:
        """Yields ``units``, advancing after each once the consumer asks for the next one."""
        for unit in units:
            yield unit
            self.advance()


# The default of functions that advance a step they are given: it reports to no one (its
# counts are never read).
UNTRACKED = Step("", 0, ignore)


@contextlib.contextmanager
def step(on_step: OnStep, name: str, total: int, unit: str = "batches") -> Iterator[Step]:
    """Step ``name`` of ``total`` units, reported as started on entry and as ended on exit
    (see the module's docstring for how it ends)."""
    current = Step(name, total, on_step, unit)
    current.report()
    try:
        yield current
    except BaseException as error:
        current.report("interrupted" if isinstance(error, KeyboardInterrupt) else "failed")
        raise
    if current.done:
        current.report("finished")
    else:
        current.done = total
        current.report("reused")
