"""Ctrl-C stops a command within seconds at any moment (cli.interrupt), in real processes."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

# A main thread that swallows KeyboardInterrupt, as a garbage-collection callback does, or
# that sits in a C call for minutes (an XLA compile): only the watcher can stop it.
DEAF = textwrap.dedent("""
    import sys, time
    from robustjax.cli.interrupt import stop_promptly
    with stop_promptly(lambda: "interrupted: 3 finished item(s) are kept", grace_s=float(sys.argv[1])):
        ready = False
        while True:
            try:
                if not ready:
                    ready = print("ready", flush=True) or True
                time.sleep(0.05)
            except KeyboardInterrupt:
                pass
""")


def _started(argv: list[str], ready: str, env: dict | None = None) -> subprocess.Popen:
    """A process started with ``argv``, once it printed a line containing ``ready``."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    while ready not in (line := process.stdout.readline()):
        assert line, f"ended before {ready!r}: {process.communicate()[1][-2000:]}"
    return process


@pytest.mark.parametrize("signals, grace_s", [(1, 2.0), (2, 600.0)])
def test_a_main_thread_that_never_returns_is_ended_by_the_watcher(signals, grace_s):
    """One signal: ended once the grace has passed; a second one: at once, whatever the grace."""
    process = _started([sys.executable, "-c", DEAF, str(grace_s)], "ready")
    for _ in range(signals):
        process.send_signal(signal.SIGINT)
        time.sleep(0.2)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert out.count("interrupted: 3 finished item(s) are kept") == 1


PLAN = """batch_size = 64
num_examples = 128
seed = 0
[[attacks]]
name = "pgd"
norm = "linf"
eps = [0.05, 0.1, 0.2]
steps = 40
[[attacks]]
name = "fgsm"
eps = 0.1
"""


@pytest.mark.parametrize("delay_s", [0.0, 4.0])
def test_evaluate_stops_within_seconds_keeping_what_finished(delay_s, tmp_path):
    """Ctrl-C while the first programs compile (no compile cache) and later while attacks run:
    exit 130, one "interrupted" line, no traceback, every finished item kept (the
    report, when the command wrote it, lists no more than the store holds)."""
    (tmp_path / "plan.toml").write_text(PLAN)
    out = tmp_path / "out"
    env = os.environ | {"JAX_PLATFORMS": "cpu"}
    process = _started([sys.executable, "-m", "robustjax.cli", "evaluate", "--plan", str(tmp_path / "plan.toml"),
                        "--out", str(out), "--compile-cache", "off"], "evaluating", env)
    time.sleep(delay_s)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)  # a hang guard: the watcher ends it after 3 s
    assert process.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert stdout.count("interrupted: ") == 1
    kept = {path.name for path in (out / "items").iterdir() if path.suffix == ".npz"}
    if (out / "report.json").is_file():
        report = json.loads((out / "report.json").read_text())
        assert report["status"] == "interrupted"
        assert len(report["attacks"]) <= len(kept)
