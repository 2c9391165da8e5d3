"""``robustjax train``: a zoo model or NAS network trained with RobustART's aligned recipe
and a list of techniques, written where ``robustjax evaluate --weights`` reads it."""

from __future__ import annotations

import argparse
import time

import jax
from rich.console import Console

from robustjax import training, zoo
from robustjax.cli.progress import Display
from robustjax.training.dataset import training_dataset
from robustjax.training.output import check_model_for


class TrainDisplay(Display):
    """A bar of steps (loss and batch accuracy in its description) on a terminal, a line
    every ``every`` steps otherwise, nothing when quiet."""

    def __init__(self, console: Console, *, quiet: bool, every: int):
        super().__init__(console, quiet)
        self.every, self.task, self.started = every, None, time.perf_counter()

    def __call__(self, report: training.StepReport) -> None:
        m = report.metrics
        text = f"train: loss {m['loss']:.4f}, batch accuracy {m['accuracy']:.3f}, lr {m['learning_rate']:.3g}"
        if self.bars is not None:
            if self.task is None:
                self.task = self.bars.add_task("train", total=report.total, completed=report.step - 1, unit="steps")
            self.bars.update(self.task, completed=report.step, description=text)
        elif not self.quiet and (report.step % self.every == 0 or report.step == report.total):
            self.console.print(f"step {report.step}/{report.total}: {text.removeprefix('train: ')} "
                               f"({time.perf_counter() - self.started:.1f} s)", highlight=False)


def cmd_train(args: argparse.Namespace, console: Console) -> int:
    techniques = training.techniques.create(args.technique)
    entry = zoo.get(args.model)
    check_model_for(args.model, techniques)
    build_kwargs: dict = {}
    if args.arch is not None:
        from robustjax.cli.nas import parse_arch, space_of_model

        space_of_model(args.model)
        build_kwargs["arch"] = parse_arch(args.arch)
    if args.num_classes is not None:
        build_kwargs["num_classes"] = args.num_classes
    dataset = training_dataset(args.dataset, args.split, data_dir=args.data_dir, image_size=args.image_size,
                               num_classes=args.num_classes)
    overrides = {k: v for k, v in (("steps", args.steps), ("epochs", args.epochs), ("batch_size", args.batch_size),
                                   ("learning_rate", args.learning_rate), ("augment", args.augment),
                                   ("drop_path_rate", args.drop_path_rate)) if v is not None}
    recipe = training.aligned(entry.family, techniques, seed=args.seed, **overrides)
    classifier = zoo.create(args.model, pretrained=False, key=jax.random.key(args.seed), **build_kwargs)
    if not args.quiet:
        console.print(f"training {classifier.name} on {dataset.name} ({dataset.num_examples} examples) with "
                      f"{techniques}: {recipe.total_steps(dataset.num_examples)} steps of {recipe.batch_size}, "
                      f"{recipe.optimizer}, augmentation {recipe.augment}, {len(jax.local_devices())} device(s)",
                      highlight=False)
    with TrainDisplay(console, quiet=args.quiet, every=args.log_every) as display:
        try:
            result = training.train(classifier, dataset, args.out, recipe, techniques, attack_eps=args.attack_eps,
                                    attack_steps=args.attack_steps, checkpoint_every=args.checkpoint_every,
                                    log_every=args.log_every, on_step=display)
        except KeyboardInterrupt:
            console.print(f"interrupted; {args.out}/checkpoints keeps the last checkpoint: the same command "
                          "resumes from it", highlight=False)
            raise
    name = training.save_trained(args.out, result, model=args.model, recipe=recipe, techniques=techniques,
                                 dataset=dataset.name, build_kwargs={k: v for k, v in build_kwargs.items()
                                                                     if k != "num_classes"},
                                 extra={"attack_eps": args.attack_eps, "attack_steps": args.attack_steps})
    if result.resumed_from and not args.quiet:
        console.print(f"resumed from step {result.resumed_from}", highlight=False)
    arch = f" --arch {args.arch}" if args.arch is not None else ""
    console.print(f"trained weights and card written to {args.out}; evaluate with "
                  f"`robustjax evaluate --model {name}{arch} --weights {args.out}`", highlight=False)
    return 0
