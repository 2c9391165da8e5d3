"""Progress on the command line, drawn with rich: the steps of an evaluation
(``evaluation.progress``) and the networks of a NAS evaluation or sweep.

On a terminal each running step is a bar with its units done, rate, time elapsed and time
left. Off a terminal (a log file, a pipe) there are no bars: each step that ends is one
line, ``attack pgd linf eps=0.03: 4 batches in 12.3 s (0.33 batches/s)``, and networks are
logged every few. With ``--quiet``, nothing. Tables and messages printed through the same
console appear above the bars; both displays are context managers that remove their bars
when the block ends, by an exception (Ctrl-C) too.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from robustjax.evaluation.progress import StepEvent


class _Rate(ProgressColumn):
    """Units per second (per hour with ``per_hour``), over rich's recent samples."""

    def __init__(self, per_hour: bool = False):
        super().__init__()
        self.per_hour = per_hour

    def render(self, task: Task) -> Text:
        if task.speed is None:
            return Text("-")
        if self.per_hour:
            return Text(f"{task.speed * 3600:,.0f} {task.fields['unit']}/h")
        return Text(f"{task.speed:.3g} {task.fields['unit']}/s")


def _bars(console: Console, per_hour: bool = False) -> Progress:
    """Description, bar, done/total, rate, time elapsed and time left."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), _Rate(per_hour),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console)


class Display:
    """Bars on a terminal unless quiet; ``self.bars`` is None otherwise."""

    def __init__(self, console: Console, quiet: bool, per_hour: bool = False):
        self.console, self.quiet = console, quiet
        self.bars = None if quiet or not console.is_terminal else _bars(console, per_hour)

    def __enter__(self):
        if self.bars is not None:
            self.bars.start()
        return self

    def __exit__(self, *_) -> None:
        if self.bars is not None:
            self.bars.stop()


class StepDisplay(Display):
    """Draws an evaluation's step events: pass it as ``evaluate``'s ``on_step``."""

    def __init__(self, console: Console, *, quiet: bool = False):
        super().__init__(console, quiet)
        self.tasks: dict[str, TaskID] = {}
        self.started: dict[str, float] = {}

    def __call__(self, event: StepEvent) -> None:
        if self.quiet:
            return
        if event.step not in self.started:
            self.started[event.step] = time.perf_counter()
            if self.bars is not None:
                self.tasks[event.step] = self.bars.add_task(event.step, total=event.total, unit=event.unit)
        if self.bars is not None:
            self.bars.update(self.tasks[event.step], completed=event.done, total=event.total)
        if event.status == "running":
            return
        seconds = time.perf_counter() - self.started.pop(event.step)
        if self.bars is not None:
            self.bars.remove_task(self.tasks.pop(event.step))
        else:
            self.console.print(step_line(event, seconds), highlight=False, soft_wrap=True)


def step_line(event: StepEvent, seconds: float) -> str:
    """The line of a step that ended."""
    if event.status == "reused":
        return f"{event.step}: reused from an earlier run's items"
    if event.status != "finished":
        return f"{event.step}: {event.status} after {event.done} of {event.total} {event.unit} ({seconds:.1f} s)"
    rate = f" ({event.done / seconds:.3g} {event.unit}/s)" if seconds > 0 else ""
    return f"{event.step}: {event.done} {event.unit} in {seconds:.1f} s{rate}"


class NetworkDisplay(Display):
    """Networks done of ``total``, rate and time left: a bar on a terminal, a line every
    ``every`` networks (and at the end) otherwise. ``advance`` takes each finished chunk
    (a sweep's ``on_chunk``, a NAS evaluation's ``on_population``); ``item`` the share of a
    running chunk's work done (a sweep's ``on_item``), so the bar, the rate and the time
    left move with every item, from the work measured so far (off a terminal, a line at
    most every ``ITEM_LINE_S`` seconds)."""

    ITEM_LINE_S = 30.0

    def __init__(self, console: Console, total: int, done: int = 0, *, quiet: bool = False, every: int = 1):
        super().__init__(console, quiet, per_hour=True)
        self.total, self.done, self.every = total, done, every
        self.started, self.at_start, self.logged = time.perf_counter(), done, done
        self.line_at = self.started
        if self.bars is not None:
            self.task = self.bars.add_task("networks", total=total, completed=done, unit="networks")

    def advance(self, chunk: list) -> None:
        self.done += len(chunk)
        if self.bars is not None:
            self.bars.update(self.task, completed=self.done)
        elif not self.quiet and (self.done - self.logged >= self.every or self.done >= self.total):
            self._line(self.done)
            self.logged = self.done

    def item(self, chunk: list, share: float) -> None:
        progressed = self.done + len(chunk) * share
        if self.bars is not None:
            self.bars.update(self.task, completed=progressed)
        elif not self.quiet and time.perf_counter() - self.line_at >= self.ITEM_LINE_S and share < 1:
            self._line(progressed)

    def _line(self, progressed: float) -> None:
        """Networks done (a fraction: the running chunk's items count), the rate measured
        since the start and the time the networks left take at that rate."""
        now = time.perf_counter()
        elapsed = now - self.started
        rate = (progressed - self.at_start) / elapsed * 3600 if elapsed > 0 else 0.0
        left = f"{(self.total - progressed) / rate * 3600:.0f} s left" if rate > 0 else "time left unknown"
        shown = f"{progressed:.0f}" if progressed == int(progressed) else f"{progressed:.1f}"
        self.console.print(f"{shown}/{self.total} networks done, {rate:,.0f} networks/h, {left} "
                           f"({elapsed:.0f} s)", highlight=False)
        self.line_at = now
