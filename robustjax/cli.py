"""The ``robustjax`` command line.

    robustjax evaluate [--model M] [--dataset D] [--split S] [--plan FILE] [--out DIR]
                       [--compile-cache DIR] [--fresh]
    robustjax zoo list [PATTERN]
    robustjax zoo card NAME
    robustjax zoo convert NAME CHECKPOINT --out DIR [--num-classes N] [--arch A]
    robustjax nas list | card SPACE ARCH | train SPACE --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from rich.console import Console

from robustjax import data, zoo
from robustjax.classifier import Classifier
from robustjax.cli_nas import add_nas_commands, load_nas_model, parse_arch, space_of_model
from robustjax.cli_sweep import add_sweep_commands
from robustjax.compile_cache import DEFAULT_COMPILE_CACHE, use_compile_cache
from robustjax.evaluation import default_plan, evaluate, load_plan, resume
from robustjax.evaluation.runner import environment, num_evaluated
from robustjax.report import metrics_table, sanity_table, summary_table, write_report

DEFAULT_MODEL = "digits_cnn"
DEFAULT_OUT = "robustjax-report"
def load_model(spec: str, weights: str | None = None, *, arch: str | None = None, supernet: str | None = None,
               calibration: data.ImageDataset | None = None) -> Classifier:
    """A zoo model name (with converted ``weights``, a folder from ``zoo convert``), or
    ``package.module:function`` returning a :class:`Classifier`.

    For a NAS model (``nas.SPACE``), ``arch`` picks the network, and ``supernet`` (a folder
    from ``nas train``) takes its weights from that supernet, with batch norm recalibrated on
    a seeded subset of ``calibration`` images.
    """
    if arch is not None or supernet is not None:
        return load_nas_model(spec, weights, arch=arch, supernet=supernet, calibration=calibration)
    return zoo.load(spec, weights=weights)


def _metric_inputs(plan, args: argparse.Namespace, console: Console) -> tuple[data.ImageDataset | None, Classifier | None]:
    """The metrics section's profiling set (the plan's split of the evaluated dataset) and
    reference model. A dataset without splits (.npz, image folder) or without that split
    profiles nothing: the metrics that need neuron bounds are then reported as skipped."""
    if plan.metrics is None:
        return None, None
    reference = None if plan.metrics.reference is None else load_model(plan.metrics.reference)
    split = plan.metrics.profile_split
    if args.dataset != "digits" and not args.dataset.startswith("tfds:"):
        console.print(f"note: {args.dataset} has no {split!r} split to profile neuron bounds on; "
                      "KMNC, NBC and SNAC will be skipped", highlight=False)
        return None, reference
    try:
        profile = data.load(args.dataset, split, image_size=args.image_size, data_dir=args.data_dir)
    except ValueError as error:
        console.print(f"note: no profiling set ({error}); KMNC, NBC and SNAC will be skipped", highlight=False)
        profile = None
    return profile, reference


def cmd_evaluate(args: argparse.Namespace, console: Console) -> int:
    """Runs the plan, keeping each finished item in OUT/items (``evaluation.resume``): a
    rerun into the same folder reuses them, and refuses those of another evaluation unless
    ``--fresh`` discards them."""
    use_compile_cache(args.compile_cache)
    dataset = data.load(args.dataset, args.split, image_size=args.image_size, data_dir=args.data_dir)
    plan = load_plan(args.plan) if args.plan else default_plan(dataset.name)
    if args.num_examples is not None:
        plan = dataclasses.replace(plan, num_examples=args.num_examples)
    folder = resume.check_output_folder(args.out, resume.expected_bytes(plan, num_evaluated(dataset, plan)))
    calibration = None
    if args.supernet is not None:
        calibration = data.load(args.dataset, "train", image_size=args.image_size, data_dir=args.data_dir)
    classifier = load_model(args.model, args.weights, arch=args.arch, supernet=args.supernet, calibration=calibration)
    profile, reference = _metric_inputs(plan, args, console)
    out = folder / "report.json"
    fingerprint = resume.fingerprint(classifier, dataset, plan, environment(), profile=profile, reference=reference)
    with resume.ItemStore.open(folder / resume.ITEMS_FOLDER, fingerprint, fresh=args.fresh) as store:
        for leftover in folder.glob(f".{out.name}.*.tmp"):  # of a killed run (the store's lock is ours)
            leftover.unlink()
        done = store.names()
        console.print(f"evaluating [bold]{classifier.name}[/] on [bold]{dataset.name}[/]: "
                      f"clean accuracy and {sum(len(run.entries()) for run in plan.runs)} attack run(s)"
                      f"{'' if plan.metrics is None else ', the 23 metrics'}; report in {out}")
        if done:
            console.print(f"resuming: {len(done)} finished item(s) in {store.folder} are reused "
                          "(--fresh starts over)", highlight=False)
        report = evaluate(classifier, dataset, plan, profile=profile, reference=reference,
                          on_update=lambda r: write_report(out, r), store=store)
    console.print(summary_table(report))
    for table in (metrics_table(report), sanity_table(report)):
        if table is not None:
            console.print(table)
    console.print(f"report written to {out}")
    return 0 if report["status"] == "complete" else 1


def cmd_zoo_list(args: argparse.Namespace, console: Console) -> int:
    for name in zoo.list_models(args.pattern):
        entry = zoo.get_entry(name)
        console.print(f"{name:32s} {entry.family:16s} {entry.description.splitlines()[0] if entry.description else ''}",
                      highlight=False)
    return 0


def cmd_zoo_card(args: argparse.Namespace, console: Console) -> int:
    console.print_json(json.dumps(zoo.card(args.name)))
    return 0


def cmd_zoo_convert(args: argparse.Namespace, console: Console) -> int:
    kwargs = {} if args.num_classes is None else {"num_classes": args.num_classes}
    if args.arch is not None:
        space_of_model(args.name)
        kwargs["arch"] = parse_arch(args.arch)
    out = zoo.convert_checkpoint(args.name, args.checkpoint, args.out, **kwargs)
    console.print(f"converted {args.checkpoint} to {out}; evaluate with "
                  f"`robustjax evaluate --model {args.name} --weights {out}`")
    return 0


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="robustjax", description="Robustness evaluation of image classifiers in JAX.")
    commands = main.add_subparsers(dest="command", required=True)

    ev = commands.add_parser("evaluate", help="run an evaluation plan and write report.json")
    ev.add_argument("--model", default=DEFAULT_MODEL, help="zoo name or package.module:function (default: %(default)s)")
    ev.add_argument("--dataset", default=data.DEFAULT_DATASET,
                    help="digits, tfds:NAME, a .npz file or an image folder (default: %(default)s)")
    ev.add_argument("--split", default="test", help="dataset split (default: %(default)s)")
    ev.add_argument("--plan", help="TOML or JSON plan file, or a built-in plan: default, digits, whitebox "
                    "(default: the built-in plan for the dataset)")
    ev.add_argument("--weights", help="folder of converted weights for a zoo model (see `zoo convert`)")
    ev.add_argument("--arch", help="for a NAS model (nas.SPACE): the network, as an id, arch string or subnet name")
    ev.add_argument("--supernet", help="for a NAS model: a folder from `nas train` to take the weights from "
                    "(batch norm recalibrated on 4,096 images of the dataset's train split)")
    ev.add_argument("--out", default=DEFAULT_OUT, help="output folder for report.json and items/, the finished "
                    "items a rerun resumes from (default: %(default)s)")
    ev.add_argument("--fresh", action="store_true", help="discard the items an earlier run kept in the output "
                    "folder and start over (needed when the plan, model, data or environment changed)")
    ev.add_argument("--num-examples", type=int, help="evaluate only the first N examples")
    ev.add_argument("--image-size", type=int, help="resize and centre-crop images to this size")
    ev.add_argument("--data-dir", help="tfds data directory")
    ev.add_argument("--compile-cache", default=DEFAULT_COMPILE_CACHE,
                    help="folder that keeps compiled programs between runs, or 'off' (default: %(default)s; "
                         "environment: ROBUSTJAX_COMPILE_CACHE)")
    ev.set_defaults(run=cmd_evaluate)

    zoo_cmd = commands.add_parser("zoo", help="the model zoo")
    zoo_sub = zoo_cmd.add_subparsers(dest="zoo_command", required=True)
    listing = zoo_sub.add_parser("list", help="list registered models")
    listing.add_argument("pattern", nargs="?", default="*", help="glob pattern (default: all)")
    listing.set_defaults(run=cmd_zoo_list)
    card = zoo_sub.add_parser("card", help="print a model's card: parameters, FLOPs, input, normalisation")
    card.add_argument("name")
    card.set_defaults(run=cmd_zoo_card)
    convert = zoo_sub.add_parser("convert", help="convert a PyTorch checkpoint (safetensors or weights-only .pt)")
    convert.add_argument("name", help="zoo model the checkpoint belongs to")
    convert.add_argument("checkpoint", help=".safetensors, .pt, .pth, .bin or .ckpt file")
    convert.add_argument("--out", required=True, help="folder to write weights/ and card.json to")
    convert.add_argument("--num-classes", type=int, help="class count of the checkpoint's head (default: the model's)")
    convert.add_argument("--arch", help="for a NAS model (nas.SPACE): the network the checkpoint holds")
    convert.set_defaults(run=cmd_zoo_convert)
    add_nas_commands(commands)
    add_sweep_commands(commands)
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


def main(argv: list[str] | None = None) -> int:
    find_user_modules()
    args = parser().parse_args(argv)
    console = Console()
    try:
        return args.run(args, console)
    except (ValueError, TypeError, OSError, ImportError) as error:
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {error}", highlight=False)  # one line
        return 2


if __name__ == "__main__":
    sys.exit(main())
