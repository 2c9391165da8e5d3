"""Ctrl-C (and SIGTERM) that stops a command within seconds, whatever its main thread is doing.

Python runs a signal's handler only when the main thread is back in the interpreter: not
while XLA compiles or runs a program, which can take minutes, and a ``KeyboardInterrupt``
raised inside a garbage-collection callback is printed and dropped. So the signal also
wakes a watcher thread at once (``signal.set_wakeup_fd``), which ends the process itself
when the command has not stopped by then. Finished work is safe at any moment: every
store writes atomically (an item's file, a sweep's SQLite transaction).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator

EXIT_INTERRUPTED = 130  # as a shell reports a process ended by SIGINT
GRACE_S = 3.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def stop_promptly(kept: Callable[[], str], grace_s: float = GRACE_S) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise ``KeyboardInterrupt`` in the main thread, so
    the command can say what it kept and return 130. If the block is still running
    ``grace_s`` seconds after the first signal, or at a second signal, the process prints
    ``kept()`` (what finished work is kept and how to resume) and exits 130 at once."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    ended = threading.Event()

    def give_up() -> None:
        with contextlib.suppress(Exception):  # kept() reads the store; the exit must happen regardless
            print(kept(), flush=True)
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)

    def watch() -> None:
        deadline = None
        while True:
            reader.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.0))
            try:
                received = reader.recv(64)
            except TimeoutError:
                received = b""
            if ended.is_set():
                return
            stops = sum(byte in STOP_SIGNALS for byte in received)
            if deadline is not None and (stops or time.monotonic() >= deadline):
                give_up()
            if stops > 1:
                give_up()
            if stops and deadline is None:
                deadline = time.monotonic() + grace_s

    previous = {signum: signal.signal(signum, _raise_interrupt) for signum in STOP_SIGNALS}
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    watcher = threading.Thread(target=watch, name="robustjax-interrupt-watcher", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        ended.set()
        writer.send(b"\0")  # wakes the watcher, which sees the block ended
        watcher.join()
        signal.set_wakeup_fd(previous_fd)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        reader.close()
        writer.close()
