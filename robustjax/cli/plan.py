"""``robustjax plan``: print a built-in plan to start a plan file from, or check one."""

from __future__ import annotations

import argparse
import dataclasses

from rich.console import Console

from robustjax import builtin_plans
from robustjax.evaluation import Plan, load_plan
from robustjax.evaluation.plan import TrainingRun


def with_options(plan: Plan, args: argparse.Namespace) -> Plan:
    """``plan`` with the command line's ``--num-examples`` and ``--precision`` where given, and
    ``--image-size`` as the size its ``[natural_shift]`` sets resize to unless the plan names one."""
    options = {"num_examples": args.num_examples, "precision": args.precision}
    image_size = getattr(args, "image_size", None)
    if plan.natural_shift is not None and plan.natural_shift.image_size is None and image_size is not None:
        options["natural_shift"] = dataclasses.replace(plan.natural_shift, image_size=image_size)
    return dataclasses.replace(plan, **{key: value for key, value in options.items() if value is not None})


def refuse_training(plan: Plan, spec: str | None) -> None:
    """Refuses a plan with a ``[training]`` table where given networks are evaluated as they are."""
    if plan.training is not None:
        raise ValueError(f"plan {spec} has a [training] table, which trains networks for a sweep: run it with "
                         f"`robustjax sweep run --models MODEL --plan {spec} --db FILE.sqlite`, or remove the table")


def cmd_plan_show(args: argparse.Namespace, console: Console) -> int:
    console.print(builtin_plans.get(args.name), markup=False, highlight=False, soft_wrap=True, end="")
    return 0


def cmd_plan_check(args: argparse.Namespace, console: Console) -> int:
    """One line: the plan is valid, and what it runs; a bad plan is an error naming its key."""
    plan = load_plan(args.file)
    attacks = sorted({run.attack.name for run in plan.runs})
    parts = [f"{plan.num_attack_entries} attack entries ({', '.join(attacks) or 'none'})"]
    for section in ("corruptions", "sequences", "system_noise", "metrics", "natural_shift"):
        if getattr(plan, section) is not None:
            parts.append(section.replace("_", " "))
    parts.append({None: "sanity checks (not in sweeps)", True: "sanity checks", False: "no sanity checks"}[
        plan.sanity.enabled])
    if plan.training is not None:
        parts.append(_training_summary(plan.training))
    console.print(f"{args.file}: a valid plan: {', '.join(parts)}", highlight=False, soft_wrap=True)
    return 0


def _training_summary(run: TrainingRun) -> str:
    sets = "; ".join(str(t) for t in run.techniques)
    settings = [f"{key}={value}" for key, value in run.recipe]
    settings += [f"{key}={getattr(run, key)}" for key in ("attack_eps", "attack_steps") if getattr(run, key) is not None]
    data = f"{run.dataset or 'the sweep dataset'} (split {run.split})"
    return (f"training of {len(run.techniques)} technique set(s) ({sets}) on {data} with the aligned recipe"
            + (f" and {', '.join(settings)}" if settings else ""))
