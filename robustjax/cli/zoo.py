"""The ``robustjax zoo`` commands: list the registered models, print a card, convert a
PyTorch checkpoint."""

from __future__ import annotations

import argparse
import itertools
import json

from rich import box
from rich.console import Console
from rich.table import Table

from robustjax import zoo
from robustjax.cli.nas import parse_arch, space_of_model


def cmd_zoo_list(args: argparse.Namespace, console: Console) -> int:
    """The models matching the pattern, grouped by family, descriptions wrapped to the terminal."""
    entries = sorted((zoo.get(name) for name in zoo.names(args.pattern)),
                     key=lambda entry: (entry.family, entry.name))
    if not entries:
        console.print(f"no zoo model matches {args.pattern!r}; `robustjax zoo list` shows them all", highlight=False)
        return 0
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("model", no_wrap=True)
    table.add_column("description", ratio=1)
    for family, members in itertools.groupby(entries, key=lambda entry: entry.family):
        table.add_row(f"[bold]{family}[/]", "")
        for entry in members:
            table.add_row(f"  {entry.name}", " ".join(entry.description.replace("``", "").split()))
    console.print(table)
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
