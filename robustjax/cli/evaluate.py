"""``robustjax evaluate``: a plan over one model, its report written as each item finishes
and its tables printed as each section does."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import jax
from rich.console import Console

from robustjax import data, distributed, zoo
from robustjax.classifier import Classifier
from robustjax.cli.interrupt import EXIT_INTERRUPTED, stop_promptly
from robustjax.cli.nas import load_nas_model
from robustjax.cli.plan import refuse_training, with_options
from robustjax.cli.progress import StepDisplay
from robustjax.compile_cache import use_compile_cache
from robustjax.evaluation import Plan, default_plan, evaluate, gallery, load_plan, resume
from robustjax.evaluation.runner import environment, num_evaluated
from robustjax.output_folder import ITEMS_FOLDER
from robustjax.report import TABLES, finished_sections, html, read_report, write_report
from robustjax.zoo.registry import MissingWeights

ENDED_EARLY = {"killed": "was killed", "interrupted": "was interrupted", "failed": "failed"}


def load_model(args: argparse.Namespace, calibration: data.ImageDataset | None = None) -> Classifier:
    """The model ``--model`` names: a zoo model (bundled, converted ``--weights`` or
    ``--random-weights``), a NAS network (``--arch``, ``--supernet``, recalibrated on
    ``calibration``), or ``package.module:function`` returning a :class:`Classifier`."""
    if args.random_weights and (args.weights is not None or ":" in args.model):
        raise ValueError("--random-weights applies to zoo models without --weights")
    if args.arch is not None or args.supernet is not None:
        return load_nas_model(args.model, args.weights, arch=args.arch, supernet=args.supernet,
                              calibration=calibration)
    try:
        return zoo.create(args.model, pretrained=False) if args.random_weights else zoo.load(args.model,
                                                                                           weights=args.weights)
    except MissingWeights as missing:
        raise ValueError(f"model {missing.name!r} has no pretrained weights in robustjax: convert a PyTorch "
                         f"checkpoint with `robustjax zoo convert {missing.name} CHECKPOINT --out DIR` and pass "
                         "--weights DIR, or pass --random-weights to time it with random weights") from None


def weights_source(args: argparse.Namespace) -> str:
    """Where ``--model``'s weights came from, as the report names them."""
    if args.random_weights:
        return "random (--random-weights)"
    if args.supernet is not None:
        return f"supernet {Path(args.supernet).resolve()}"
    if args.weights is not None:
        return str(Path(args.weights).resolve())
    return f"returned by {args.model}" if ":" in args.model else "bundled with robustjax"


def _metric_inputs(plan, args: argparse.Namespace, console: Console) -> tuple[data.ImageDataset | None,
                                                                              Classifier | None]:
    """The metrics section's profiling set (the plan's split of the evaluated dataset) and
    reference model. A dataset without splits (.npz, image folder) or without that split
    profiles nothing: the metrics that need neuron bounds are then reported as skipped."""
    if plan.metrics is None:
        return None, None
    reference = None if plan.metrics.reference is None else zoo.load(plan.metrics.reference)
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


def _previous_run(out: Path) -> str | None:
    """The status of the report an earlier run left in ``out``, if any can be read."""
    try:
        return read_report(out)["status"] if out.is_file() else None
    except ValueError:
        return None


def _remove_gallery(folder: Path) -> None:
    """Removes an earlier run's gallery (this run writes its own if it ends) and the temporary
    files that killed writers of the gallery and of report.html left."""
    for stale in [folder / gallery.FILE, *folder.glob(f".{gallery.FILE}.*.tmp"), *folder.glob(f".{html.FILE}.*.tmp")]:
        stale.unlink(missing_ok=True)


def _save_gallery(classifier: Classifier, dataset: data.ImageDataset, plan: Plan, folder: Path,
                  console: Console) -> dict | None:
    """The finished run's gallery (``evaluation.gallery``), saved in ``folder``; None, with a
    note, when it cannot be made: the evaluation is done and stays so."""
    try:
        arrays = gallery.gallery(classifier, dataset, plan)
    except Exception as error:  # noted; the report is complete without it
        console.print(f"note: no gallery in {html.FILE} ({type(error).__name__}: {error})", highlight=False)
        return None
    gallery.save(folder / gallery.FILE, arrays)
    return arrays


@contextlib.contextmanager
def open_items(folder: Path, fingerprint: dict, fresh: bool) -> Iterator[resume.ItemStore]:
    """The run's item store in ``folder``; in the other processes of a multi-host run, a
    replica of what the main process found there (its error, if it met one, raised in all)."""
    if jax.process_count() > 1:
        store, error = None, None
        if distributed.is_main():
            try:
                store = resume.ItemStore.open(folder, fingerprint, fresh=fresh)
            except (OSError, ValueError) as raised:
                error = raised
        payload = distributed.share_from_main(
            b"E" + str(error).encode() if error else b"S" + (store.snapshot() if store else b""))
        if error is not None:
            raise error
        if payload[:1] == b"E":
            raise ValueError(f"process 0: {payload[1:].decode()}")
        store = store or resume.ReplicaStore(payload[1:])
        with store:
            yield store
        return
    with resume.ItemStore.open(folder, fingerprint, fresh=fresh) as store:
        yield store


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What an evaluation reads before it runs: every check of the input happens there."""

    plan: Plan
    classifier: Classifier
    dataset: data.ImageDataset
    profile: data.ImageDataset | None
    reference: Classifier | None

    @property
    def fingerprint(self) -> dict:
        return resume.fingerprint(self.classifier, self.dataset, self.plan, environment(), profile=self.profile,
                                  reference=self.reference)


def read_inputs(args: argparse.Namespace, console: Console) -> Inputs:
    use_compile_cache(args.compile_cache)
    plan = with_options(load_plan(args.plan) if args.plan else default_plan(args.dataset), args)
    refuse_training(plan, args.plan)
    calibration = None
    if args.supernet is not None:
        calibration = data.load(args.dataset, "train", image_size=args.image_size, data_dir=args.data_dir)
    classifier = load_model(args, calibration)
    if classifier.name == Classifier.name:  # a user's model left unnamed: the spec the user typed
        classifier = classifier.replace(name=args.model)
    dataset = data.load(args.dataset, args.split, image_size=args.image_size, data_dir=args.data_dir,
                        num_classes=classifier.num_classes, channels=classifier.input_shape[-1])
    return Inputs(plan, classifier, dataset, *_metric_inputs(plan, args, console))


def _evaluate_beside_main(args: argparse.Namespace) -> int:
    """A multi-host run's process other than 0: the same computation, nothing printed or written."""
    inputs = read_inputs(args, Console(quiet=True))
    with open_items(Path(args.out) / ITEMS_FOLDER, inputs.fingerprint, args.fresh) as store:
        evaluate(inputs.classifier, inputs.dataset, inputs.plan, profile=inputs.profile, reference=inputs.reference,
                 store=store)
    return 0


def cmd_evaluate(args: argparse.Namespace, console: Console) -> int:
    """Runs the plan, keeping each finished item in OUT/items (``evaluation.resume``): a
    rerun into the same folder reuses them, and refuses those of another evaluation unless
    ``--fresh`` discards them. Every check of the input runs before the long work starts.
    ``--quiet`` leaves out the progress and the status lines, not the tables and notes.
    With ``--distributed`` every process computes, and process 0 alone prints and writes."""
    if not args.distributed and (args.coordinator, args.num_processes, args.process_id) != (None, None, None):
        raise ValueError("--coordinator, --num-processes and --process-id go with --distributed")
    if not distributed.is_main():
        return _evaluate_beside_main(args)
    folder = resume.check_output_folder(args.out)
    inputs = read_inputs(args, console)
    plan, classifier, dataset = inputs.plan, inputs.classifier, inputs.dataset
    resume.check_free_space(folder, resume.expected_bytes(plan, num_evaluated(dataset, plan)))
    out = folder / "report.json"
    previous = _previous_run(out)
    printed = set()
    say = (lambda *_, **__: None) if args.quiet else console.print

    def update(report: dict) -> None:
        write_report(out, report)
        if report["status"] != "running":  # the end, or an interruption: the page says what is missing
            html.write_html(folder / html.FILE, report)
        for section in finished_sections(report):
            if section not in printed:
                console.print(TABLES[section](report))
                printed.add(section)

    with open_items(folder / ITEMS_FOLDER, inputs.fingerprint, args.fresh) as store:
        for leftover in folder.glob(f".{out.name}.*.tmp"):  # of a killed run (the store's lock is ours)
            leftover.unlink()
        _remove_gallery(folder)
        done = store.names()
        say(f"evaluating [bold]{classifier.name}[/] on [bold]{dataset.name}[/]: "
            f"clean accuracy and {plan.num_attack_entries} attack run(s)"
            f"{'' if plan.metrics is None else ', the 23 metrics'}; report in {out}")
        if previous in ENDED_EARLY:
            console.print(f"the earlier run into {folder} {ENDED_EARLY[previous]} before it finished", highlight=False)
        if done:
            say(f"resuming: {len(done)} finished item(s) in {store.folder} are reused "
                "(--fresh starts over)", highlight=False)
        def kept() -> str:
            return (f"interrupted: {len(store.names())} finished item(s) are kept in {store.folder}; rerun the same "
                    "command to resume")

        try:
            with stop_promptly(kept), StepDisplay(console, quiet=args.quiet) as steps:
                report = evaluate(classifier, dataset, plan, profile=inputs.profile, reference=inputs.reference,
                                  on_update=update, store=store, on_step=steps, weights=weights_source(args))
        except KeyboardInterrupt:
            console.print(f"interrupted: {len(store.names())} finished item(s) are kept in {store.folder} and "
                          f"{out} has them (status \"interrupted\"); rerun the same command to resume",
                          highlight=False, soft_wrap=True)
            return EXIT_INTERRUPTED
    html.write_html(folder / html.FILE, report, _save_gallery(classifier, dataset, plan, folder, console))
    say(f"report written to {out}")
    return 0 if report["status"] == "complete" else 1
