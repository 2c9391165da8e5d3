"""The ``robustjax nas`` commands: search spaces, one network's card, supernet training, and
many networks evaluated as populations.

    robustjax nas list
    robustjax nas card SPACE ARCH
    robustjax nas train SPACE --out DIR [--steps N] [--dataset D] ...
    robustjax nas evaluate SPACE [--ids 0-63 | --n N] [--plan FILE] [--supernet DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from robustjax import data, nas, zoo
from robustjax.classifier import Classifier
from robustjax.cli import DEFAULT_DATASET, add_plan_options
from robustjax.cli.plan import refuse_training, with_options
from robustjax.cli.progress import NetworkDisplay
from robustjax.evaluation import default_plan, load_plan
from robustjax.evaluation.items import check_population_plan
from robustjax.evaluation.population import evaluate_population

NAS_MODEL_PREFIX = "nas."


def parse_arch(text: str) -> Any:
    """An id when ``text`` is an integer; otherwise an arch string, arch id or subnet name."""
    return int(text) if text.strip().isdigit() else text


def space_of_model(model: str):
    """The search space behind zoo model ``nas.SPACE``."""
    if not model.startswith(NAS_MODEL_PREFIX):
        raise ValueError(f"--arch and --supernet apply to NAS models (nas.SPACE), not to {model!r}")
    return nas.space(model.removeprefix(NAS_MODEL_PREFIX))


def load_nas_model(spec: str, weights: str | None, *, arch: str | None, supernet: str | None,
                   calibration: data.ImageDataset | None) -> Classifier:
    """Network ``arch`` of NAS model ``nas.SPACE``: from the zoo (bundled or converted
    ``weights``), or sliced from a trained ``supernet`` folder and recalibrated on a seeded
    subset of 4,096 ``calibration`` images."""
    space = space_of_model(spec)
    chosen = parse_arch(arch) if arch is not None else None
    if supernet is None:
        return zoo.create(spec, weights=weights, arch=chosen)
    if calibration is None:
        raise ValueError("--supernet needs a dataset with a train split to recalibrate batch norm on")
    trained = nas.Supernet.load(supernet, space=space)
    config = space.resolve(nas.models.default_arch(space) if chosen is None else chosen)
    return trained.subnet(config, calibration=nas.calibration_subset(calibration),
                          name=f"{spec}:{nas.models.arch_label(space, config)}")


def cmd_nas_list(args: argparse.Namespace, console: Console) -> int:
    """One line per space: name, size, whether a trained supernet is bundled, description."""
    console.print(f"{'space (zoo model nas.SPACE)':31s} {'networks':>16s}  supernet  description", highlight=False)
    for name in nas.names():
        embedded = "bundled" if name in nas.models.EMBEDDED else "-"
        console.print(f"{name:31s} {len(nas.space(name)):>16,}  {embedded:8s}  {' '.join(nas.space_doc(name).split())}",
                      highlight=False, soft_wrap=True)
    return 0


def cmd_nas_card(args: argparse.Namespace, console: Console) -> int:
    console.print_json(json.dumps(nas.models.network_card(nas.space(args.space), parse_arch(args.arch))))
    return 0


def cmd_nas_train(args: argparse.Namespace, console: Console) -> int:
    space = nas.space(args.space)
    settings = nas.TrainSettings(steps=args.steps, batch_size=args.batch_size, learning_rate=args.learning_rate,
                                 checkpoint_every=args.checkpoint_every, seed=args.seed)
    images, labels = data.load(args.dataset, "train", data_dir=args.data_dir).arrays()
    started = time.perf_counter()
    console.print(f"training the {space.name} supernet on {args.dataset}/train ({len(labels):,} images) for "
                  f"{settings.steps} steps; checkpoints in {args.out}/checkpoints (a rerun resumes)", highlight=False)
    supernet = nas.train_supernet(space, images, labels, args.out, settings, log=lambda step, loss: console.print(
        f"step {step}/{settings.steps}: loss {loss:.4f} ({time.perf_counter() - started:.0f} s)", highlight=False))
    supernet.save(args.out, extra={"settings": dataclasses.asdict(settings), "dataset": args.dataset})
    console.print(f"supernet written to {args.out}; evaluate a subnet with `robustjax evaluate --model "
                  f"nas.{space.name} --supernet {args.out} --arch ID`", highlight=False)
    return 0


def parse_ids(text: str) -> list[int]:
    """``"0-9,20,30-31"`` -> [0, ..., 9, 20, 30, 31]."""
    ids = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise ValueError(f"--ids takes ids and ranges like 0-99,120, got {part!r}")
        ids.extend(range(int(first), int(last or first) + 1))
    return ids


NOISE_CAPTIONS = {"corruptions": "corruptions: mean accuracy", "system noise": "system noise: mean accuracy",
                  "flip prob.": "flip prob.: mean ImageNet-P flip probability"}


def _noise_means(result: dict) -> dict[str, float]:
    """One network's mean figure per noise section its plan has."""
    sections = (("corruptions", "corruptions", "accuracy"), ("system noise", "system_noise", "accuracy"),
                ("flip prob.", "sequences", "flip_probability"))
    return {column: float(np.mean([entry[figure] for entry in result[part]]))
            for column, part, figure in sections if result[part]}


def cmd_nas_evaluate(args: argparse.Namespace, console: Console) -> int:
    space = nas.space(args.space)
    plan = load_plan(args.plan) if args.plan else default_plan("digits")
    if args.plan is None:  # the digits plan's attacks; its metrics do not run on populations
        plan = dataclasses.replace(plan, metrics=None, corruptions=None, sequences=None, system_noise=None)
    plan = with_options(plan, args)
    refuse_training(plan, args.plan)
    check_population_plan(plan)
    archs = parse_ids(args.ids) if args.ids else space.sample(jax.random.key(args.seed), args.n)
    if args.supernet:
        supernet = nas.Supernet.load(args.supernet, space=space)
    elif space.name in nas.models.EMBEDDED:
        supernet = nas.bundled_supernet(space.name)
    else:
        raise ValueError(f"{space.name} has no bundled supernet: pass --supernet DIR (from `robustjax nas train`)")
    dataset = data.load(args.dataset, args.split, data_dir=args.data_dir)
    calibration = data.load(args.dataset, "train", data_dir=args.data_dir)
    with NetworkDisplay(console, len(archs), quiet=args.quiet) as progress:
        results = evaluate_population(supernet, archs, dataset, plan, calibration=calibration,
                                      population_size=args.population_size, network_shards=args.network_shards,
                                      layout=args.layout, on_population=progress.advance)
    noise_columns = list(_noise_means(results[0]))
    table = Table(title=f"{len(results)} network{'s' * (len(results) != 1)} of {space.name} on {dataset.name}",
                  title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  caption="; ".join(NOISE_CAPTIONS[column] for column in noise_columns) or None)
    table.add_column("network", min_width=len("network"), overflow="fold")  # a long id folds, the figures stay whole
    for column in ("MFLOPs", "clean", *[f"{r['name']} {r['params'].get('eps', '')}" for r in results[0]["attacks"]],
                   *noise_columns):
        table.add_column(column, justify="right", min_width=max(len("0.000"), *map(len, column.split())))
    for arch, result in zip(archs, results):
        config = space.resolve(arch)
        table.add_row(nas.models.arch_label(space, config), f"{space.cost(config).flops / 1e6:.1f}",
                      f"{result['clean_accuracy']:.3f}", *[f"{a['robust_accuracy']:.3f}" for a in result["attacks"]],
                      *[f"{value:.3f}" for value in _noise_means(result).values()])
    console.print(table)
    if args.out:
        Path(args.out).write_text(json.dumps([{k: v for k, v in r.items() if k != "per_example"} for r in results],
                                             indent=2) + "\n")
        console.print(f"results written to {args.out}", highlight=False)
    return 0


def add_arguments(group: argparse.ArgumentParser) -> None:
    """The group's commands under its parser ``group``; ``robustjax.cli.parser`` calls this only when
    one of them is given."""
    nas_sub = group.add_subparsers(dest="nas_command", required=True)
    listing = nas_sub.add_parser("list", help="list the search spaces")
    listing.set_defaults(run=cmd_nas_list)
    card = nas_sub.add_parser("card", help="print one network's card: id, config, parameters, FLOPs")
    card.add_argument("space", help="search space (see `robustjax nas list`)")
    card.add_argument("arch", help="an id, an NB201 arch string, a BigNAS arch id or a RobustART subnet name")
    card.set_defaults(run=cmd_nas_card)
    train = nas_sub.add_parser("train", help="train (or resume training) a supernet: sandwich rule or single path")
    train.add_argument("space", help="search space (see `robustjax nas list`)")
    train.add_argument("--out", required=True, help="folder for checkpoints/ and the trained supernet")
    train.add_argument("--dataset", default=DEFAULT_DATASET, help="training set (default: %(default)s)")
    train.add_argument("--data-dir", help="tfds data directory")
    defaults = nas.TrainSettings()
    train.add_argument("--steps", type=int, default=defaults.steps, help="optimizer steps (default: %(default)s)")
    train.add_argument("--batch-size", type=int, default=defaults.batch_size, help="(default: %(default)s)")
    train.add_argument("--learning-rate", type=float, default=defaults.learning_rate, help="(default: %(default)s)")
    train.add_argument("--checkpoint-every", type=int, default=defaults.checkpoint_every,
                       help="steps between checkpoints (default: %(default)s)")
    train.add_argument("--seed", type=int, default=defaults.seed, help="(default: %(default)s)")
    train.set_defaults(run=cmd_nas_train)
    ev = nas_sub.add_parser("evaluate", help="evaluate many subnets as populations (one program per population)")
    ev.add_argument("space", help="search space (see `robustjax nas list`)")
    ev.add_argument("--ids", help="network ids and ranges, e.g. 0-63,100 (default: --n random ones)")
    ev.add_argument("--n", type=int, default=16, help="how many random networks without --ids (default: %(default)s)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the random networks (default: %(default)s)")
    ev.add_argument("--plan", help="plan file or built-in plan; clean, [[attacks]], [corruptions], [sequences] "
                    "and [system_noise] apply "
                    "(default: the digits plan's attacks)")
    ev.add_argument("--supernet", help="folder from `nas train` (default: the space's bundled supernet)")
    ev.add_argument("--dataset", default=DEFAULT_DATASET, help="(default: %(default)s; its train split "
                    "recalibrates batch norm)")
    ev.add_argument("--split", default="test", help="(default: %(default)s)")
    ev.add_argument("--data-dir", help="tfds data directory")
    add_plan_options(ev)
    ev.add_argument("--population-size", type=int, default=64, help="networks per compiled program "
                    "(default: %(default)s)")
    ev.add_argument("--network-shards", type=int, default=1, help="devices the networks of a population split "
                    "over; the others split the examples (default: %(default)s)")
    ev.add_argument("--layout", choices=nas.population.LAYOUTS, default="auto",
                    help="masks: subnets of a resolution side by side in one program over the supernet's shapes; "
                    "sequential: one after another in that program, each NB201 edge running only its op; "
                    "packed: side by side, each NB201 edge running each op once on the examples of the networks "
                    "choosing it (a population size divisible by 25 lets every population share one program), each "
                    "BigNAS block at each shape its networks take (a program per population); "
                    "exact: each at its own shapes, one program each; auto: exact for a lone network, sequential "
                    "for NB201 on the CPU, masks otherwise (default: %(default)s)")
    ev.add_argument("--out", help="JSON file for the per-network results")
    ev.add_argument("--quiet", action="store_true", help="no progress (a bar on a terminal, a line per population "
                    "otherwise); the table and errors still print")
    ev.set_defaults(run=cmd_nas_evaluate)
