"""The ``robustjax`` command line.

    robustjax evaluate [--model M] [--dataset D] [--split S] [--plan FILE] [--out DIR] ...
    robustjax report PATH
    robustjax plan show [NAME] | check FILE
    robustjax zoo list [PATTERN] | card NAME | convert NAME CHECKPOINT --out DIR
    robustjax train --model M --dataset D --technique pgd_at[,mixup,...] --out DIR
    robustjax nas list | card SPACE ARCH | train SPACE --out DIR | evaluate SPACE ...
    robustjax sweep run | status | export | analyze

This module builds the parser without importing JAX, so that ``--help`` answers at once:
each command's module is imported when the command runs, and the ``nas`` and ``sweep``
groups define their arguments in their own modules, imported only when one of their
commands is given.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

from robustjax import builtin_plans
from robustjax.cli.interrupt import EXIT_INTERRUPTED
from robustjax.compile_cache import DEFAULT_COMPILE_CACHE

DEFAULT_MODEL = "digits_cnn"
DEFAULT_DATASET = "digits"
DEFAULT_OUT = "robustjax-report"
EXIT_BAD_INPUT = 2
# Command groups whose arguments their module defines, and the help line each shows in ``--help``.
GROUPS = {
    "nas": ("robustjax.cli.nas", "NAS search spaces, supernets, and many networks evaluated as populations"),
    "sweep": ("robustjax.cli.sweep", "a plan over many networks, resumable, on one machine or Ray"),
}


def command(module: str, function: str) -> Callable[[argparse.Namespace, Console], int]:
    """``module.function``, imported when the command runs (after ``--distributed`` has
    joined the process to its cluster: that must come before JAX starts a backend, which
    importing the command's modules may do)."""
    def run(args: argparse.Namespace, console: Console) -> int:
        if getattr(args, "distributed", False):
            from robustjax import distributed

            distributed.initialize(args.coordinator, args.num_processes, args.process_id)
        return getattr(importlib.import_module(module), function)(args, console)

    return run


def add_plan_options(command: argparse.ArgumentParser) -> None:
    """Options that override the plan's own settings (``cli.plan.with_options`` applies them)."""
    command.add_argument("--num-examples", type=int, help="evaluate only the first N examples")
    command.add_argument("--precision", help="float32 or bfloat16: the network's convolutions and matrix products "
                         "in bfloat16, everything else float32 (default: the plan's, float32)")


def _add_evaluate(commands: argparse._SubParsersAction) -> None:
    ev = commands.add_parser("evaluate", help="run an evaluation plan and write report.json")
    ev.add_argument("--model", default=DEFAULT_MODEL, help="zoo name or package.module:function (default: %(default)s)")
    ev.add_argument("--dataset", default=DEFAULT_DATASET,
                    help="digits, tfds:NAME, a .npz file or an image folder (default: %(default)s)")
    ev.add_argument("--split", default="test", help="dataset split (default: %(default)s)")
    ev.add_argument("--plan", help=f"TOML or JSON plan file, or a built-in plan: {', '.join(builtin_plans.evaluation_plans())} "
                    "(default: digits for the digits, default otherwise)")
    ev.add_argument("--weights", help="folder of converted weights for a zoo model (see `zoo convert`)")
    ev.add_argument("--random-weights", action="store_true", help="evaluate a zoo model with random initial "
                    "weights (to time it; its accuracy means nothing)")
    ev.add_argument("--arch", help="for a NAS model (nas.SPACE): the network, as an id, arch string or subnet name")
    ev.add_argument("--supernet", help="for a NAS model: a folder from `nas train` to take the weights from "
                    "(batch norm recalibrated on 4,096 images of the dataset's train split)")
    ev.add_argument("--out", default=DEFAULT_OUT, help="output folder for report.json and items/, the finished "
                    "items a rerun resumes from (default: %(default)s)")
    ev.add_argument("--fresh", action="store_true", help="discard the items an earlier run kept in the output "
                    "folder and start over (needed when the plan, model, data or environment changed)")
    add_plan_options(ev)
    ev.add_argument("--image-size", type=int, help="resize and centre-crop images to this size")
    ev.add_argument("--data-dir", help="tfds data directory")
    ev.add_argument("--compile-cache", default=DEFAULT_COMPILE_CACHE,
                    help="folder that keeps compiled programs between runs, or 'off' (default: %(default)s; "
                         "environment: ROBUSTJAX_COMPILE_CACHE)")
    ev.add_argument("--distributed", action="store_true", help="one process per host: every host's devices in one "
                    "mesh, results gathered to process 0, which alone writes --out (see the README's multi-host "
                    "section); JAX finds the cluster on SLURM, MPI or TPU, else give the next three")
    ev.add_argument("--coordinator", help="with --distributed: HOST:PORT of process 0")
    ev.add_argument("--num-processes", type=int, help="with --distributed: how many processes take part")
    ev.add_argument("--process-id", type=int, help="with --distributed: this process's index, 0 to N-1")
    ev.add_argument("--quiet", action="store_true", help="no progress (bars on a terminal, a line per step "
                    "otherwise) and no status lines; the tables, notes and errors still print")
    ev.set_defaults(run=command("robustjax.cli.evaluate", "cmd_evaluate"))


def _add_report(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser("report", help="print the tables of a report.json and how far its run got, and "
                                 "render its report.html")
    report.add_argument("path", nargs="?", help="a report.json, the output folder of `robustjax evaluate`, or a "
                        "sweep database (`robustjax sweep run --db`): its page of robustness against cost and rank "
                        "correlations")
    report.add_argument("--html", metavar="OUT", help="where to write the HTML page (default: report.html beside "
                        "the report; DB.html beside a sweep database DB.sqlite)")
    report.add_argument("--db", metavar="DB", help="a sweep database, with --arch")
    report.add_argument("--arch", metavar="ID", help="one network of the sweep (its arch_id, as `robustjax sweep "
                        "export` lists them): its report.json and report.html, as robustjax evaluate writes them, "
                        "from the sweep's records (a plan with [metrics], [natural_shift] or [sanity] enabled)")
    report.add_argument("--out", metavar="DIR", help="with --arch: the folder to write to (default: DB-ID)")
    report.set_defaults(run=command("robustjax.cli.report", "cmd_report"))


def _add_plan(commands: argparse._SubParsersAction) -> None:
    plan = commands.add_parser("plan", help="print a built-in plan to start from, or check a plan file")
    plan_sub = plan.add_subparsers(dest="plan_command", required=True)
    show = plan_sub.add_parser("show", help="print a built-in plan as TOML")
    show.add_argument("name", nargs="?", default="default", choices=builtin_plans.names(),
                      help="the built-in plan (default: %(default)s)")
    show.set_defaults(run=command("robustjax.cli.plan", "cmd_plan_show"))
    check = plan_sub.add_parser("check", help="validate a TOML or JSON plan file and summarise what it runs")
    check.add_argument("file")
    check.set_defaults(run=command("robustjax.cli.plan", "cmd_plan_check"))


def _add_zoo(commands: argparse._SubParsersAction) -> None:
    zoo_cmd = commands.add_parser("zoo", help="the model zoo")
    zoo_sub = zoo_cmd.add_subparsers(dest="zoo_command", required=True)
    listing = zoo_sub.add_parser("list", help="list registered models")
    listing.add_argument("pattern", nargs="?", default="*", help="glob pattern (default: all)")
    listing.set_defaults(run=command("robustjax.cli.zoo", "cmd_zoo_list"))
    card = zoo_sub.add_parser("card", help="print a model's card: parameters, FLOPs, input, normalisation")
    card.add_argument("name")
    card.set_defaults(run=command("robustjax.cli.zoo", "cmd_zoo_card"))
    convert = zoo_sub.add_parser("convert", help="convert a PyTorch checkpoint (safetensors or weights-only .pt)")
    convert.add_argument("name", help="zoo model the checkpoint belongs to")
    convert.add_argument("checkpoint", help=".safetensors, .pt, .pth, .bin or .ckpt file")
    convert.add_argument("--out", required=True, help="folder to write weights/ and card.json to")
    convert.add_argument("--num-classes", type=int, help="class count of the checkpoint's head (default: the model's)")
    convert.add_argument("--arch", help="for a NAS model (nas.SPACE): the network the checkpoint holds")
    convert.set_defaults(run=command("robustjax.cli.zoo", "cmd_zoo_convert"))


def _add_train(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help="train a zoo model or NAS network with RobustART's aligned recipe and "
                                "training techniques; `evaluate --weights OUT` evaluates it")
    train.add_argument("--model", default=DEFAULT_MODEL, help="zoo name (default: %(default)s)")
    train.add_argument("--arch", help="for a NAS model (nas.SPACE): the network, as an id, arch string or subnet name")
    train.add_argument("--dataset", default=DEFAULT_DATASET, help="digits, tfds:NAME, a .npz file or an image folder "
                       "(all of a file or folder is trained on) (default: %(default)s)")
    train.add_argument("--split", default="train", help="split to train on (default: %(default)s)")
    train.add_argument("--technique", default="", help="comma-separated techniques: pgd_at, madry, trades, fast_at, "
                       "mixup, cutmix, augmix, no_label_smoothing, no_ema, adamw, dropout, drop_path, reparam (default: "
                       "none, the baseline recipe)")
    train.add_argument("--out", required=True, help="folder for checkpoints/, metrics.jsonl, weights/ and card.json; "
                       "a rerun of the same command resumes from its checkpoints")
    length = train.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, help="training steps (default: from --epochs)")
    length.add_argument("--epochs", type=float, help="passes over the training set (default: the recipe's 100)")
    train.add_argument("--batch-size", type=int, help="examples per step, over all devices (default: 512)")
    train.add_argument("--learning-rate", type=float, help="peak learning rate (default: the recipe's)")
    train.add_argument("--augment", choices=("standard", "pad_crop_flip", "none"), help="per-image augmentation "
                       "inside the training step: standard (RobustART's random resized crop, flip and colour "
                       "jitter), pad_crop_flip (CIFAR's 4-pixel pad, random crop and flip) or none (default: "
                       "standard for ImageNet-scale zoo families, pad_crop_flip for CIFAR ones, none for the digits "
                       "and NAS networks)")
    train.add_argument("--drop-path-rate", type=float, help="with technique drop_path: the stochastic-depth rate "
                       "(default: 0.1, RobustART's)")
    train.add_argument("--seed", type=int, default=0, help="seed of the initial weights, batches and attacks "
                       "(default: %(default)s)")
    train.add_argument("--attack-eps", type=float, help="linf radius of the adversarial-training attack "
                       "(default: the technique's; step sizes keep their ratio to it)")
    train.add_argument("--attack-steps", type=int, help="steps of the adversarial-training attack (default: the "
                       "technique's)")
    train.add_argument("--num-classes", type=int, help="classes of the model's head (default: the model's)")
    train.add_argument("--image-size", type=int, help="resize and centre-crop images to this size")
    train.add_argument("--data-dir", help="tfds data directory")
    train.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints "
                       "(default: %(default)s)")
    train.add_argument("--log-every", type=int, default=10, help="steps between lines of metrics.jsonl "
                       "(default: %(default)s)")
    train.add_argument("--quiet", action="store_true", help="no progress and no status lines")
    train.set_defaults(run=command("robustjax.cli.train", "cmd_train"))


def parser(group: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``group`` (``nas`` or ``sweep``), that group's
    commands are defined in full (importing their module), the others by their help line."""
    main = argparse.ArgumentParser(prog="robustjax", description="Robustness evaluation of image classifiers in JAX.")
    commands = main.add_subparsers(dest="command", required=True)
    _add_evaluate(commands)
    _add_report(commands)
    _add_plan(commands)
    _add_zoo(commands)
    _add_train(commands)
    for name, (module, help_line) in GROUPS.items():
        group_parser = commands.add_parser(name, help=help_line)
        if name == group:
            importlib.import_module(module).add_arguments(group_parser)
    return main


def find_user_modules() -> None:
    """Lets ``--model mymodels:my_model`` import ``mymodels.py`` from the working folder.

    ``python -m`` and ``python script.py`` put a folder on ``sys.path``; an installed
    console script does not, so the command adds the working folder itself (last, so
    that a file there never shadows an installed package).
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _quiet_closed_event_loops(unraisable) -> None:
    """Drops the "Event loop is closed" errors that orbax's asyncio helpers raise while being
    collected after a failed read (the read's own error already says what went wrong, in one
    line); every other unraisable error is reported as Python reports it."""
    if isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed":
        return
    sys.__unraisablehook__(unraisable)


def main(argv: list[str] | None = None) -> int:
    sys.unraisablehook = _quiet_closed_event_loops
    find_user_modules()
    argv = sys.argv[1:] if argv is None else argv
    args = parser(argv[0] if argv and argv[0] in GROUPS else None).parse_args(argv)
    console = Console()
    errors = Console(stderr=True, soft_wrap=True)  # soft wrap: each message stays one line
    try:
        return args.run(args, console)
    except (ValueError, TypeError, OSError, ImportError) as error:
        errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        errors.print("interrupted", highlight=False)  # the command said what it kept, where it could
        return EXIT_INTERRUPTED


def script() -> None:
    """The ``robustjax`` command: exits with ``main``'s code. After an interruption the
    process ends at once, its output flushed, without the interpreter's shutdown (which can
    crash while XLA's threads still compile or run the program the interruption left)."""
    code = main()
    if code == EXIT_INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
