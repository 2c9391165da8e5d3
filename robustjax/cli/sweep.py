"""The ``robustjax sweep`` commands: a plan over many networks, resumable, local or on Ray.

    robustjax sweep run --db results.sqlite [--space NAME [--n N | --ids 0-999 | --all] [--weights DIR]
                        | --models a,b] [--plan FILE] [--ray auto|ADDRESS]
    robustjax sweep status --db results.sqlite
    robustjax sweep export --db results.sqlite --format csv|jsonl|parquet --out FILE [--join FILE]
    robustjax sweep analyze --db results.sqlite --out DIR

With no flags but ``--db``, 64 random subnets of the bundled NAS-Bench-201 digits supernet
run under the built-in ``sweep`` plan. A rerun of the same command resumes a killed sweep.
A plan with a ``[training]`` table (or ``--train TECHNIQUES``) trains each of ``--models``, or
each NAS-Bench-201 cell of ``--space``, from scratch with each of its technique sets into
``<db>.trained/`` first (cells a population at a time), then evaluates the networks of one
architecture, or the cells, together.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import jax
import numpy as np
from rich.console import Console

from robustjax import nas
from robustjax.cli import DEFAULT_DATASET, add_plan_options
from robustjax.cli.interrupt import EXIT_INTERRUPTED, stop_promptly
from robustjax.cli.nas import parse_ids
from robustjax.cli.plan import with_options
from robustjax.cli.progress import NetworkDisplay
from robustjax.compile_cache import DEFAULT_COMPILE_CACHE, use_compile_cache
from robustjax.evaluation import load_plan
from robustjax.evaluation.plan import Plan, TrainingRun, technique_set
from robustjax.nas.recalibrate import DEFAULT_IMAGES
from robustjax.sweep import export, trained
from robustjax.sweep.analyze import analyze
from robustjax.sweep.engine import SWEEP_LAYOUTS, Sweep, context, open_store, run_local
from robustjax.sweep.ray_executor import check_executable, connect, run_ray
from robustjax.sweep.store import Store, worker_id
from robustjax.training import StepReport

DEFAULT_SPACE = "nb201_digits"
DEFAULT_PLAN = "sweep"
DEFAULT_N = 64


def _sweep_and_archs(args: argparse.Namespace) -> tuple[Sweep, list]:
    plan = _with_training(with_options(load_plan(args.plan), args), args.train)
    common = {"plan": plan, "dataset": args.dataset, "split": args.split, "data_dir": args.data_dir,
              "population_size": args.population_size, "calibration_images": args.calibration_images,
              "network_shards": args.network_shards, "layout": args.layout}
    if args.models:
        if args.space or args.ids or args.all or args.n is not None or args.supernet or args.weights:
            raise ValueError("--models runs a list of models; --space, --ids, --n, --all, --supernet and --weights "
                             "apply to NAS spaces")
        models = tuple(m.strip() for m in args.models.split(",") if m.strip())
        trained_dir = None if plan.training is None else f"{args.db}.trained"
        return Sweep(models=models, trained_dir=trained_dir, **common), list(models)
    if plan.training is not None and (args.weights or args.supernet):
        raise ValueError("--train and a plan's [training] table train the cells from scratch; --weights and "
                         "--supernet give networks already trained")
    space = nas.space(args.space or DEFAULT_SPACE)
    if sum([bool(args.ids), args.all, args.n is not None]) > 1:
        raise ValueError("choose the networks with one of --ids, --n and --all")
    if args.ids:
        archs = parse_ids(args.ids)
    elif args.all:
        archs = range(len(space))  # never listed whole: open_store refuses a space too large for one database
    elif args.weights:  # the folder's networks
        if args.n is not None:
            raise ValueError("--weights sweeps every network of its folder: choose some with --ids, not --n")
        archs = sorted(nas.standalone.folder_entries(args.weights))
    else:
        archs = space.sample(jax.random.key(args.seed), DEFAULT_N if args.n is None else args.n)
    trained_dir = None if plan.training is None else f"{args.db}.trained"
    return Sweep(space=space.name, supernet=args.supernet, weights=args.weights, trained_dir=trained_dir,
                 **common), archs


def _with_training(plan: Plan, techniques: str | None) -> Plan:
    """``plan`` whose networks train with the one technique set ``techniques`` (``--train``):
    its ``[training]`` table's recipe with that set, or the aligned recipe."""
    if techniques is None:
        return plan
    run = plan.training or TrainingRun(techniques=())
    return dataclasses.replace(plan, training=dataclasses.replace(run, techniques=(technique_set("--train", techniques),)))


class TrainingProgress:
    """Each trained network's steps: a bar under the networks' on a terminal, otherwise a
    line when it starts (or resumes) and at each tenth of its steps."""

    def __init__(self, display: NetworkDisplay):
        self.display, self.tasks, self.started = display, {}, {}

    def __call__(self, arch_id: str, report: StepReport) -> None:
        display = self.display
        if display.quiet:
            return
        first = arch_id not in self.started
        self.started.setdefault(arch_id, time.perf_counter())
        if display.bars is not None:
            if first:
                self.tasks[arch_id] = display.bars.add_task(f"train {arch_id}", total=report.total,
                                                            completed=report.step - 1, unit="steps")
            display.bars.update(self.tasks[arch_id], completed=report.step)
        elif first or report.step % max(1, report.total // 10) == 0 or report.step == report.total:
            verb = "resuming" if first and report.step > 1 else "training"
            display.console.print(f"{verb} {arch_id}: step {report.step}/{report.total}, {_figures(report.metrics)} "
                                  f"({time.perf_counter() - self.started[arch_id]:.0f} s)", highlight=False)


def _figures(metrics: dict) -> str:
    """A training step's loss and batch accuracy; a population's (per-network lists, None
    for a stopped network) as means over the networks still training."""
    loss, accuracy = metrics["loss"], metrics["accuracy"]
    if not isinstance(loss, list):
        return f"loss {loss:.4f}, batch accuracy {accuracy:.3f}"
    running = [i for i, value in enumerate(loss) if value is not None]
    if not running:
        return f"all {len(loss)} networks stopped"
    return (f"mean loss {np.mean([loss[i] for i in running]):.4f}, batch accuracy "
            f"{np.mean([accuracy[i] for i in running]):.3f} over {len(running)} of {len(loss)} networks")


def cmd_sweep_run(args: argparse.Namespace, console: Console) -> int:
    use_compile_cache(args.compile_cache)
    sweep, archs = _sweep_and_archs(args)
    if args.ray:  # fail fast on a bad address, before loading anything
        check_executable(sweep)
        connect(args.ray)
    store, selection = open_store(sweep, args.db, archs)
    if args.retry_failed:
        retried = store.forget_failed(selection)
        if not args.quiet:
            console.print(f"{retried} failed items will run again", highlight=False)
    done = len(store.done() & set(selection))
    if not args.quiet:
        to_train = "" if not sweep.training else "; {} to train into {}".format(
            sum(not trained.is_trained(context(sweep).folder(a)) for a in selection), sweep.trained_dir)
        console.print(f"sweep of {len(selection)} networks into {args.db} ({done} done already; "
                      f"{len(store.item_keys())} items each{to_train})", highlight=False)
    worker = worker_id()
    started = time.perf_counter()

    def kept() -> str:  # also from the interrupt watcher's thread: a connection of its own
        return (f"interrupted: {len(Store.read(args.db).done() & set(selection))}/{len(selection)} networks are "
                f"done in {args.db}; rerun the same command to go on")

    try:
        with stop_promptly(kept), NetworkDisplay(console, len(selection), done, quiet=args.quiet,
                                                 every=args.log_every) as progress:
            if args.ray:
                run_ray(sweep, store, selection, address=args.ray, worker=worker, lease_s=args.lease,
                        on_chunk=progress.advance, log=lambda line: console.print(line, highlight=False),
                        compile_cache=args.compile_cache)
            else:
                run_local(sweep, store, selection, worker=worker, lease_s=args.lease, on_chunk=progress.advance,
                          on_item=progress.item, on_train=TrainingProgress(progress))
    except KeyboardInterrupt:
        console.print(kept(), highlight=False, soft_wrap=True)
        return EXIT_INTERRUPTED
    status = store.status()
    if not args.quiet:
        console.print(f"{len(store.done() & set(selection))}/{len(selection)} networks done in "
                      f"{time.perf_counter() - started:.0f} s ({status['with_failures']} with a failed item); "
                      f"export with `robustjax sweep export --db {args.db} --format csv --out results.csv`",
                      highlight=False)
    return _report_failures(store.failures(selection), len(selection), console)


def _report_failures(failures: list[tuple[list[str], str, int]], networks: int, console: Console) -> int:
    """Prints each item that failed on every network with its error (a cause that is not the
    networks', such as a missing package) and returns 1 when there is one, else 0."""
    everywhere = [(labels, error) for labels, error, count in failures if count == networks]
    for labels, error in everywhere:
        console.print(f"error: {', '.join(labels)} failed on every network: {error}", highlight=False)
    if everywhere:
        console.print("fix the cause, then rerun with --retry-failed", highlight=False)
    return 1 if everywhere else 0


def _existing(path: str) -> Store:
    if not Path(path).is_file():
        raise ValueError(f"no sweep database at {path}")
    return Store.read(path)


def cmd_sweep_status(args: argparse.Namespace, console: Console) -> int:
    store = _existing(args.db)
    status = store.status()
    rate = status["networks_per_hour"]
    left = (status["networks"] - status["done"]) / rate * 3600 if rate else None
    console.print(f"{status['done']}/{status['networks']} networks done ({status['items']} items each, "
                  f"{status['rows']} rows); {status['with_failures']} with a failed item", highlight=False)
    console.print(f"rate over the last hour: {'-' if rate is None else f'{rate:,.0f} networks/h'}; "
                  f"time left: {'-' if left is None else f'{left:.0f} s'}", highlight=False)
    for holder, count in status["claimed"].items():
        console.print(f"worker {holder} holds {count} networks", highlight=False)
    return 0


def cmd_sweep_export(args: argparse.Namespace, console: Console) -> int:
    rows = export.table(_existing(args.db)).rows
    if args.join:
        rows, matched = export.join(rows, args.join, on=args.join_on)
        console.print(f"joined {matched} of {len(rows)} networks with {args.join} on {args.join_on} "
                      f"({len(rows) - matched} without a match)", highlight=False)
    export.write(rows, args.out, args.format)
    console.print(f"{len(rows)} networks written to {args.out}", highlight=False)
    return 0


def cmd_sweep_analyze(args: argparse.Namespace, console: Console) -> int:
    table = export.table(_existing(args.db))
    result = analyze(table, args.out)
    console.print(f"analysis of {result['networks']} networks written to {args.out}: {', '.join(result['files'])}",
                  highlight=False)
    return 0


def add_arguments(group: argparse.ArgumentParser) -> None:
    """The group's commands under its parser ``group``; ``robustjax.cli.parser`` calls this only when
    one of them is given."""
    sub = group.add_subparsers(dest="sweep_command", required=True)
    run = sub.add_parser("run", help="run (or resume) a sweep into a SQLite database", description=(
        "Evaluates a plan over many networks into a SQLite database; rerun the same command to resume. The "
        "networks are subnets of a NAS space, or --models. A plan with a [training] table (`robustjax plan show "
        "techniques`) or --train trains each of --models, or each NAS-Bench-201 cell of --space, from scratch once "
        "per technique set into DB.trained/ (cells a population at a time; a killed training resumes from its "
        "checkpoint; a finished one is reused), then evaluates the trained networks of one architecture, or the "
        "cells, as populations."))
    run.add_argument("--db", required=True, help="the sweep's SQLite database (made, or resumed)")
    run.add_argument("--space", help=f"NAS search space (default: {DEFAULT_SPACE}; see `robustjax nas list`)")
    run.add_argument("--models", help="comma-separated zoo models or package.module:function, instead of a space; "
                     "with a plan's [training] table, the zoo models to train")
    run.add_argument("--ids", help="network ids and ranges, e.g. 0-999")
    run.add_argument("--n", type=int, help=f"how many random networks (default: {DEFAULT_N})")
    run.add_argument("--all", action="store_true", help="every network of the space")
    run.add_argument("--seed", type=int, default=0, help="seed of the random networks (default: %(default)s)")
    run.add_argument("--plan", default=DEFAULT_PLAN, help="plan file or built-in plan (default: %(default)s); "
                     "clean, [[attacks]], [corruptions], [sequences], [system_noise] and [training] apply")
    add_plan_options(run)
    run.add_argument("--train", metavar="TECHNIQUES", help="train the networks from scratch first: a technique set, "
                     "e.g. pgd_at or 'trades,no_ema' (`robustjax train --help` lists them); the plan's [training] "
                     "table gives the recipe if it has one, RobustART's aligned recipe otherwise")
    run.add_argument("--supernet", help="folder from `nas train` (default: the space's bundled supernet)")
    run.add_argument("--weights", help="folder of the space's standalone trained networks, one per NAS-Bench-201 "
                     "index ({index}.pth xautodl state dicts or `zoo convert` folders {index}/): sweeps them, every "
                     "one in the folder unless --ids chooses")
    run.add_argument("--dataset", default=DEFAULT_DATASET, help="(default: %(default)s; its train split "
                     "recalibrates batch norm)")
    run.add_argument("--split", default="test", help="(default: %(default)s)")
    run.add_argument("--data-dir", help="tfds data directory")
    run.add_argument("--population-size", type=int, default=64, help="networks per compiled program "
                     "(default: %(default)s)")
    run.add_argument("--network-shards", type=int, default=1, help="devices the networks of a population split "
                     "over; the others split the examples (default: %(default)s)")
    run.add_argument("--layout", choices=SWEEP_LAYOUTS, default="auto",
                     help="how a population of subnets runs: masks (side by side), sequential (one after another), "
                     "packed (side by side, each NB201 op run once on the examples of the networks choosing it, "
                     "a population size divisible by 25 letting every population share one program; each BigNAS "
                     "block at each shape its networks take, a program per population); "
                     "auto: sequential for NB201 on the CPU, masks otherwise. Cells trained from scratch (--train) "
                     "train side by side (masks), one after another (sequential) or, under auto on the CPU, each at "
                     "its own shapes, a few cells to a program (default: %(default)s)")
    run.add_argument("--calibration-images", type=int, default=DEFAULT_IMAGES,
                     help="training images that recalibrate each subnet's batch norm (default: %(default)s)")
    run.add_argument("--ray", help="run on a Ray cluster: 'auto' or HOST:PORT of its head (needs robustjax[ray])")
    run.add_argument("--lease", type=float, default=1800.0, help="seconds a worker's claim lasts without renewal "
                     "(default: %(default)s)")
    run.add_argument("--retry-failed", action="store_true", help="run the items that failed before again "
                     "(a failed item is otherwise kept, with its error, and not rerun)")
    run.add_argument("--quiet", action="store_true", help="print nothing but errors")
    run.add_argument("--log-every", type=int, default=64, help="networks between progress lines off a terminal "
                     "(default: %(default)s)")
    run.add_argument("--compile-cache", default=DEFAULT_COMPILE_CACHE,
                     help="folder that keeps compiled programs between runs, or 'off'; with --ray every "
                          "worker uses it, so give a folder they all reach (default: %(default)s)")
    run.set_defaults(run=cmd_sweep_run)
    status = sub.add_parser("status", help="networks done, rate, time left, workers")
    status.add_argument("--db", required=True)
    status.set_defaults(run=cmd_sweep_status)
    exp = sub.add_parser("export", help="one row per network: config, cost and every figure")
    exp.add_argument("--db", required=True)
    exp.add_argument("--format", choices=export.FORMATS, default="csv")
    exp.add_argument("--out", required=True, help="file to write")
    exp.add_argument("--join", help="a published table (CSV or JSON lines) to join by --join-on, e.g. "
                     "NAS-Bench-201's per-architecture results")
    exp.add_argument("--join-on", default="index", help="the column both tables share (default: %(default)s, "
                     "NAS-Bench-201's id)")
    exp.set_defaults(run=cmd_sweep_export)
    ana = sub.add_parser("analyze", help="RobustART's analysis: robustness vs cost, rank correlations, search "
                         "dimensions, Pareto fronts")
    ana.add_argument("--db", required=True)
    ana.add_argument("--out", required=True, help="folder for the CSV tables, PNG plots and summary.md")
    ana.set_defaults(run=cmd_sweep_analyze)
