"""Progress: the runner reports each step's units as they are done, and the command line
draws them as bars on a terminal and as one line per step elsewhere."""

import io
import re

import pytest
from rich.console import Console

import robustjax as rj
from robustjax.cli import main, parser
from robustjax.cli.progress import NetworkDisplay, StepDisplay
from robustjax.evaluation import AttackRun, Plan, evaluate
from robustjax.evaluation.plan import CorruptionRun, SanityRun
from robustjax.evaluation.progress import StepEvent, step
from robustjax.evaluation.resume import ItemStore

PLAN = Plan(runs=(AttackRun(rj.attacks.FGSM(eps=0.1)),), corruptions=CorruptionRun(("brightness",), (1, 2)),
            batch_size=8, num_examples=20, sanity=SanityRun(enabled=False))  # 3 batches of 8 (8 devices)


def by_step(events: list[StepEvent]) -> dict[str, list[tuple[int, int, str]]]:
    steps = {}
    for event in events:
        steps.setdefault(event.step, []).append((event.done, event.total, event.status))
    return steps


def test_the_runner_reports_every_batch_of_every_step_and_reused_items_as_done(digits_clf, tmp_path):
    events = []
    with ItemStore.open(tmp_path / "items", {"plan": 1}) as store:
        evaluate(digits_clf, rj.data.digits("test"), PLAN, store=store, on_step=events.append)
    batches = [(0, 3, "running"), (1, 3, "running"), (2, 3, "running"), (3, 3, "running"), (3, 3, "finished")]
    assert by_step(events) == {
        "clean": batches,
        "attack fgsm eps=0.1": batches,
        "corruption brightness": [(i, 6, "running") for i in range(7)] + [(6, 6, "finished")],  # 2 severities
    }
    events.clear()
    with ItemStore.open(tmp_path / "items", {"plan": 1}) as store:
        evaluate(digits_clf, rj.data.digits("test"), PLAN, store=store, on_step=events.append)
    assert [(e.step, e.done, e.total, e.status) for e in events if e.status != "running"] == [
        ("clean", 3, 3, "reused"), ("attack fgsm eps=0.1", 3, 3, "reused"), ("corruption brightness", 6, 6,
                                                                                  "reused")]


@pytest.mark.parametrize("error, status", [(RuntimeError, "failed"), (KeyboardInterrupt, "interrupted")])
def test_a_step_that_raises_ends_failed_or_interrupted(error, status):
    events = []
    with pytest.raises(error), step(events.append, "pgd", 4) as current:
        current.advance()
        raise error
    assert events[-1] == StepEvent("pgd", 1, 4, status)


def events_of(name: str, total: int, unit: str = "batches") -> list[StepEvent]:
    return [StepEvent(name, done, total, unit=unit) for done in range(total + 1)] + [
        StepEvent(name, total, total, "finished", unit)]


def test_off_a_terminal_each_step_is_one_line():
    console = Console(file=io.StringIO(), force_terminal=False, width=80)
    with StepDisplay(console) as display:
        for event in events_of("attack pgd linf eps=0.03", 4) + events_of("sanity", 5, "checks"):
            display(event)
        display(StepEvent("clean", 0, 3))
        display(StepEvent("clean", 3, 3, "reused"))
        display(StepEvent("corruption fog", 0, 5))
        display(StepEvent("corruption fog", 2, 5, "failed"))
    lines = console.file.getvalue().splitlines()
    assert len(lines) == 4
    assert re.fullmatch(r"attack pgd linf eps=0\.03: 4 batches in \d+\.\d s( \(\S+ batches/s\))?", lines[0])
    assert lines[1].startswith("sanity: 5 checks in ")
    assert lines[2] == "clean: reused from an earlier run's items"
    assert re.fullmatch(r"corruption fog: failed after 2 of 5 batches \(\d+\.\d s\)", lines[3])


def test_quiet_prints_nothing():
    console = Console(file=io.StringIO(), force_terminal=True)
    with StepDisplay(console, quiet=True) as display:
        for event in events_of("clean", 2):
            display(event)
    with NetworkDisplay(console, 4, quiet=True) as networks:
        networks.advance(["a", "b", "c", "d"])
    assert console.file.getvalue() == ""


def test_on_a_terminal_a_step_is_a_bar_with_its_rate_and_time_left():
    console = Console(file=io.StringIO(), force_terminal=True, color_system=None, width=120)
    with StepDisplay(console) as display:
        for event in events_of("attack pgd linf eps=0.03", 4)[:3]:  # 2 of 4 batches done
            display(event)
        display.bars.refresh()
        console.print("a table printed meanwhile")
    text = console.file.getvalue()
    assert "attack pgd linf eps=0.03" in text and "2/4" in text and "━" in text
    assert re.search(r"\S+ batches/s", text)  # the rate
    assert re.search(r"\d:\d\d:\d\d \d:\d\d:\d\d", text)  # time elapsed, time left
    assert "a table printed meanwhile" in text


def test_networks_are_logged_every_few_off_a_terminal():
    console = Console(file=io.StringIO(), force_terminal=False, width=120)
    with NetworkDisplay(console, 5, 1, every=2) as networks:
        for chunk in (["a"], ["b", "c"], ["d"]):
            networks.advance(chunk)
    lines = console.file.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == ["4/5 networks done", "5/5 networks done"]
    assert "networks/h" in lines[0] and "left" in lines[0]


@pytest.mark.parametrize("argv", [["evaluate", "--quiet"], ["nas", "evaluate", "nb201_digits", "--quiet"],
                                  ["sweep", "run", "--db", "s.sqlite", "--quiet"]])
def test_quiet_is_an_option_of_the_long_commands(argv):
    assert parser(argv[0] if argv[0] != "evaluate" else None).parse_args(argv).quiet


def test_evaluate_logs_each_step_unless_quiet(tmp_path, capsys):
    plan = tmp_path / "plan.toml"
    plan.write_text('batch_size = 8\nnum_examples = 8\n[[attacks]]\nname = "fgsm"\neps = 0.1\n'
                    '[sanity]\nenabled = false\n')
    assert main(["evaluate", "--plan", str(plan), "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^clean: 1 batches in ", out, re.MULTILINE)
    assert re.search(r"^attack fgsm eps=0\.1: 1 batches in ", out, re.MULTILINE)
    assert main(["evaluate", "--plan", str(plan), "--out", str(tmp_path / "b"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "batches in" not in out and "evaluating" not in out and "report written" not in out
    assert "fgsm eps=0.1" in out  # the attack table
