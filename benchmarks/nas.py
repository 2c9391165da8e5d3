"""Networks per hour for a fixed plan over NAS subnets: populations against one network at a time.

    python -m benchmarks.nas --space nb201_digits --networks 64 --alone 8
    python -m benchmarks.nas --space bignas_resnet_basic_digits --networks 64 --alone 8
    python -m benchmarks.nas --space nb201 --networks 64 --alone 2 --torch 2   # CIFAR size, for a GPU
    python -m benchmarks.nas --scale cifar     # CIFAR size on a CPU: 32 networks, 1 alone, 2 in torch

The plan is clean accuracy, FGSM and PGD-10 (Linf, eps 0.1) on 256 test digits, each
subnet sliced from the bundled supernet with batch norm recalibrated on 1,024 training
digits. Two ways, both robustjax, on the same subnets and keys:

- population: ``evaluate_population`` with ``--population-size`` networks per compiled
  program (recalibration batched in);
- alone: each subnet sliced out, recalibrated and evaluated by ``robustjax.evaluation.evaluate``
  (a new architecture per subnet, so a compile per network: the anchors' one network per
  process, without the process start);
- torch: the anchors' way, each subnet built in PyTorch (xautodl's ``TinyNetwork``, or
  RobustART's BigNAS layout) with the same sliced weights, batch norm recalibrated as OFA
  and RobustART do (training-mode passes, cumulative averages), then torchattacks' FGSM
  and PGD-10.

Both include compilation (it is part of the cost of a sweep) and are timed end to end;
networks per hour = networks / wall seconds * 3600. Compiles are counted. Two more rows
give the steady state, where every program is compiled already: *population_warm* (the
same populations again) and *alone_warm* (the same sliced subnets evaluated again): the
rate exact shapes would reach if compiling cost nothing, the ceiling of any per-network
program on this machine.

Besides the rows: the population size each item's program runs at (the largest that fits
the device's free memory, ``ItemRunner.fitting_size``: a sweep on a smaller device runs
smaller parts) and the process's peak resident memory.

A last row, *machine_ceiling*, bounds every way of computing the plan on this machine: the
plan's arithmetic per network (2 x the subnet's MACs per image pass; an attack step is a
forward pass and an input gradient, two passes; weight gradients are not needed) at the
float32 throughput of XLA's best kernel here, a large matrix product. No program, in any
library, evaluates more networks per hour than that.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import resource
import time
from pathlib import Path

import jax
import numpy as np

import robustjax as rj
from benchmarks.common import RESULTS, machine_facts, matmul_peak_gflops
from robustjax.evaluation import evaluate
from robustjax.evaluation.items import ItemRunner, expand, rung
from robustjax.evaluation.plan import plan_from_dict
from robustjax.evaluation.population import evaluate_population
from robustjax.nas.bignas_packed import PackedSubnets, block_keys
from robustjax.nas.nb201_packed import signature_of
from robustjax.nas.population import choose_layout, from_supernet, packing_order

PLAN = {"batch_size": 256, "num_examples": 256, "seed": 0, "sanity": {"enabled": False},
        "attacks": [{"name": "fgsm", "eps": 0.1}, {"name": "pgd", "eps": 0.1, "steps": 10}]}


CALIBRATION_IMAGES = 1024
CIFAR_CALIBRATION_IMAGES = 256  # --scale cifar: a 2-core CPU's share of the work, as the plan's 256 images
BIGNAS_SWEEP = 1024  # sampled subnets whose packed programs --arithmetic counts


def image_passes(plan: dict, calibration_images: int) -> int:
    """Forward-pass equivalents of the plan per network: batch-norm recalibration, the clean
    pass, and per attack its steps (forward and input gradient) and its final forward pass."""
    steps = sum(2 * attack.get("steps", 1) + 1 for attack in plan["attacks"])
    return calibration_images + plan["num_examples"] * (1 + steps)


def machine_ceiling(space: rj.nas.SearchSpace, archs: list, peak_gflops: float, plan: dict = PLAN,
                    calibration_images: int = CALIBRATION_IMAGES) -> dict:
    """Networks per hour of ``archs`` under the plan at ``peak_gflops``, from their MACs."""
    flops = 2 * float(np.mean([space.cost(arch).macs for arch in archs])) * image_passes(plan, calibration_images)
    seconds = flops / (peak_gflops * 1e9)
    return {"networks": len(archs), "seconds": round(seconds * len(archs), 1), "compiles": None,
            "networks_per_hour": round(3600 / seconds), "gflop_per_network": round(flops / 1e9, 2),
            "peak_gflops": round(peak_gflops, 1)}


class CompileCounter:
    """Counts XLA backend compilations while active."""

    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


def torch_network(supernet: rj.nas.Supernet, config):
    """The PyTorch twin of a subnet (xautodl's TinyNetwork or RobustART's BigNAS ResNet)
    holding the weights sliced from the supernet."""
    from flax import nnx

    weights = nnx.to_pure_dict(nnx.state(supernet.subnet_module(config)))
    space = supernet.space
    if isinstance(space, rj.nas.NB201Space):
        from benchmarks.torch_nb201 import tiny_network

        return tiny_network(space, config, weights)
    from benchmarks.torch_bignas import BigNASResNet, load_robustjax_weights

    net = BigNASResNet(config.block, config.widths, config.depths, config.kernels, config.expand_ratios,
                       strides=space.strides, in_channels=space.in_channels, num_classes=space.num_classes,
                       projections=[False] + [space.has_projection(s) for s in range(1, 5)])
    return load_robustjax_weights(net, weights)


def torch_alone(supernet: rj.nas.Supernet, configs: list, calibration: np.ndarray, dataset, threads: int,
                plan: dict = PLAN) -> float:
    """Seconds to recalibrate and evaluate ``configs`` one at a time in PyTorch + torchattacks
    (on the GPU when JAX runs on one, ``benchmarks.common.torch_device``)."""
    import torch
    import torchattacks

    from benchmarks.common import synchronized, torch_device
    from benchmarks.torch_models import Normalized

    torch.set_num_threads(threads)
    device = torch_device()
    space = supernet.space
    x, y = dataset.arrays(limit=plan["num_examples"])
    images = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(device)
    labels = torch.from_numpy(y.astype(np.int64)).to(device)
    calib = torch.from_numpy(calibration.transpose(0, 3, 1, 2).copy()).to(device)

    start = time.perf_counter()
    for config in configs:
        model = Normalized(torch_network(supernet, config), space.mean, space.std).to(device)
        model.train()
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.reset_running_stats()
                module.momentum = None  # a cumulative average over the calibration batches
        with torch.no_grad():
            for batch in calib.split(256):
                model(batch)
        model.eval()
        with torch.no_grad():
            (model(images).argmax(1) == labels).float().mean()
        for attack in (torchattacks.FGSM(model, eps=0.1),
                       torchattacks.PGD(model, eps=0.1, alpha=0.025, steps=10, random_start=True)):
            adversarial = attack(images, labels)
            with torch.no_grad():
                synchronized((model(adversarial).argmax(1) == labels).float().mean())
    return time.perf_counter() - start


def fitting_sizes(supernet: rj.nas.Supernet, archs: list, dataset, plan, calibration: np.ndarray,
                  layout: str) -> dict[str, int]:
    """Per item, the most networks of a population of ``archs`` its program runs at once in
    the device's free memory (compiling each item's program for the memory analysis)."""
    runner = ItemRunner(dataset, plan)
    chosen = choose_layout(layout, len(archs), supernet.space)
    sequential = chosen == "sequential"
    population = from_supernet(supernet, archs, calibration=calibration, sequential=sequential,
                               packed=chosen == "packed")
    return {item.labels[0]: runner.fitting_size(item, population.classifier, population.axes, sequential)
            for item in expand(plan)}


def arithmetic(supernet: rj.nas.Supernet, archs: list, dataset, plan, layout: str) -> dict:
    """Per item, the FLOPs one batch's program executes over the population of ``archs``
    in ``layout`` against the sum of each network's own (XLA's cost analysis of the
    item's program for that network alone at its own shapes). Side by side (masks) XLA's
    count of the vmapped program is what runs. One after another (sequential), XLA counts a
    loop's body once with every branch of a switch, which is not what runs: each network
    runs its body once and each edge only its op (counted at run time by
    tests/test_nas_population.py), so it executes its own FLOPs, the ratio 1 by
    construction, and the row gives XLA's static count beside it. Packed, XLA's count is
    what runs (each op on its group's examples)."""
    plan = dataclasses.replace(plan, runs=tuple(  # XLA's cost analysis counts a rolled loop's body once
        dataclasses.replace(run, attack=dataclasses.replace(run.attack, unroll=True))
        if hasattr(run.attack, "unroll") else run for run in plan.runs))
    runner = ItemRunner(dataset, plan)
    chosen = choose_layout(layout, len(archs), supernet.space)
    sequential = chosen == "sequential"
    population = from_supernet(supernet, archs, sequential=sequential, packed=chosen == "packed")
    rows = {}
    for item in expand(plan):
        own = sum(runner.compiled(item, supernet.subnet(arch), None).cost_analysis()["flops"] for arch in archs)
        static = runner.compiled(item, population.classifier, population.axes, sequential).cost_analysis()["flops"]
        rows[item.labels[0]] = {"own_gflops": round(own / 1e9, 2), "xla_static_gflops": round(static / 1e9, 2),
                                "executed_over_own": 1.0 if sequential else round(static / own, 2)}
    return {"layout": chosen, "networks": len(archs), "per_item": rows}


def programs_for_every_cell(space: rj.nas.NB201Space, population_size: int, plan, layout: str) -> int:
    """The programs a sweep of all 15,625 NAS-Bench-201 cells (one resolution) compiles:
    per item, one per population size it runs (the full populations' and the last one's
    rung, ``items.rung``), whatever the cells; exact shapes compile one per cell and item;
    packed, one per population signature (:func:`packed_programs`)."""
    items, chosen = len(expand(plan)), choose_layout(layout, population_size, space)
    if chosen == "exact":
        return len(space) * items
    if chosen == "packed":
        return packed_programs(space, [space.config(index) for index in range(len(space))], population_size, plan)
    full, last = divmod(len(space), population_size)
    sizes = ({population_size} if full else set()) | ({rung(last, population_size)} if last else set())
    return items * len(sizes)


def packed_programs(space: rj.nas.SearchSpace, configs: list, population_size: int, plan) -> int:
    """The programs a packed sweep of ``configs`` compiles: per item, one per population
    signature, the configs in ``nas.population.packing_order``."""
    configs = packing_order(space, configs, population_size)
    populations = [configs[start:start + population_size] for start in range(0, len(configs), population_size)]
    last = populations[-1]
    if len(last) < population_size:  # padded with copies of its first network (items.rung)
        last.extend(last[:1] * (rung(len(last), population_size) - len(last)))
    if isinstance(space, rj.nas.NB201Space):
        signatures = {signature_of(np.stack([c.op_indices() for c in p])) for p in populations}
    else:
        signatures = {PackedSubnets.of([block_keys(space, c) for c in p]).signature for p in populations}
    return len(expand(plan)) * len(signatures)


def inputs(space: str | rj.nas.SearchSpace, num_examples: int, calibration_images: int):
    """The supernet, evaluated set and calibration images of a benchmark space: the bundled
    digits supernets on the digits, or a random supernet of another space (by name, or a
    space itself) on random images (accuracies then mean nothing; the work per network is
    that of the space's own dataset)."""
    if isinstance(space, str) and space in rj.nas.models.EMBEDDED:
        return (rj.nas.bundled_supernet(space), rj.data.digits("test"),
                rj.nas.calibration_subset(rj.data.digits("train"), calibration_images))
    space = rj.nas.space(space) if isinstance(space, str) else space
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (num_examples + calibration_images, *space.input_shape), dtype=np.uint8)
    labels = rng.integers(0, space.num_classes, num_examples)
    dataset = rj.data.from_arrays(images[:num_examples], labels, num_classes=space.num_classes,
                                  name="random images of the space's input size")
    return rj.nas.Supernet.create(space, key=jax.random.key(0)), dataset, images[num_examples:].astype(np.float32) / 255


def measure(space: str | rj.nas.SearchSpace, *, networks: int, alone: int, torch: int, population_size: int,
            threads: int = 2, plan: dict = PLAN, calibration_images: int = CALIBRATION_IMAGES,
            warm: bool = True, layout: str = "auto") -> dict:
    """The benchmark's rows (population, alone, their warm twins when ``warm``, torch when
    ``torch`` > 0, the machine's ceiling), the population's ratio over each, whether the
    shared networks' results agree, the population size each item runs at, compiles and
    the process's peak memory."""
    supernet, dataset, calibration = inputs(space, plan["num_examples"], calibration_images)
    archs = supernet.space.sample(jax.random.key(0), networks)
    parsed = plan_from_dict(plan)
    sizes = fitting_sizes(supernet, archs[:population_size], dataset, parsed, calibration, layout)
    counter = CompileCounter()

    start, compiles = time.perf_counter(), counter.count
    population = evaluate_population(supernet, archs, dataset, parsed, calibration=calibration,
                                     population_size=population_size, layout=layout)
    population_s, population_compiles = time.perf_counter() - start, counter.count - compiles

    start, compiles = time.perf_counter(), counter.count
    alone_reports = [evaluate(supernet.subnet(arch, calibration=calibration), dataset, parsed)
                     for arch in archs[:alone]]
    alone_s, alone_compiles = time.perf_counter() - start, counter.count - compiles

    def row(count: int, seconds: float, compiles: int | None) -> dict:
        return {"networks": count, "seconds": round(seconds, 1), "compiles": compiles,
                "networks_per_hour": round(count / seconds * 3600)}

    rows = {"population": row(networks, population_s, population_compiles), "alone": row(alone, alone_s, alone_compiles)}
    if warm:
        start = time.perf_counter()
        evaluate_population(supernet, archs, dataset, parsed, calibration=calibration, population_size=population_size,
                            layout=layout)
        rows["population_warm"] = row(networks, time.perf_counter() - start, 0)
        subnets = [supernet.subnet(arch, calibration=calibration) for arch in archs[:alone]]
        for subnet in subnets:
            evaluate(subnet, dataset, parsed)
        start = time.perf_counter()
        for subnet in subnets:  # the recalibration as in the alone row, then the plan: compiled already
            supernet.subnet(subnet.name, calibration=calibration)
            evaluate(subnet, dataset, parsed)
        rows["alone_warm"] = row(alone, time.perf_counter() - start, 0)
    if torch:
        rows["torch"] = row(torch, torch_alone(supernet, archs[:torch], calibration, dataset, threads, plan), None)
    rows["machine_ceiling"] = machine_ceiling(supernet.space, archs, matmul_peak_gflops(), plan, calibration_images)
    agree = all(p["clean_accuracy"] == a["clean"]["accuracy"]
                and [x["robust_accuracy"] for x in p["attacks"]] == [x["robust_accuracy"] for x in a["attacks"]]
                for p, a in zip(population, alone_reports))
    return {"results": rows, "population_over": {name: round(rows["population"]["networks_per_hour"]
                                                             / r["networks_per_hour"], 2)
                                                 for name, r in rows.items() if name != "population"},
            "results_equal": agree, "population_size_run": sizes,
            "arithmetic": arithmetic(supernet, archs[:min(8, population_size)], dataset, parsed, layout),
            **({"programs_for_all_15625_cells": programs_for_every_cell(supernet.space, population_size, parsed, layout)}
               if isinstance(supernet.space, rj.nas.NB201Space) else {}),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def write_arithmetic(space_name: str, population_size: int, out: Path) -> None:
    """The accounting of :func:`arithmetic` for every population layout of ``space_name``,
    printed and written to results/nas_arithmetic_SPACE.BACKEND.json."""
    supernet, dataset, _ = inputs(space_name, PLAN["num_examples"], 1)
    plan, archs = plan_from_dict(PLAN), supernet.space.sample(jax.random.key(0), 8)
    layouts = ("masks", "sequential", "packed") if isinstance(supernet.space, rj.nas.NB201Space) else ("masks", "packed")
    measured = {layout: arithmetic(supernet, archs, dataset, plan, layout) for layout in layouts}
    if isinstance(supernet.space, rj.nas.NB201Space):
        measured["programs_for_all_15625_cells"] = {
            layout: programs_for_every_cell(supernet.space, population_size, plan, layout)
            for layout in (*layouts, "exact")}
        # packing_order gives every full population one signature where 25 divides the size
        measured["programs_for_all_15625_cells"]["packed, population size 125"] = programs_for_every_cell(
            supernet.space, 125, plan, "packed")
    else:  # subnets of different shapes have different signatures: about a program per population
        sample = supernet.space.sample(jax.random.key(1), BIGNAS_SWEEP)
        measured[f"packed_programs_for_{BIGNAS_SWEEP}_sampled_subnets"] = packed_programs(
            supernet.space, sample, population_size, plan)
        measured["populations"] = -(-BIGNAS_SWEEP // population_size)
    print(json.dumps(measured, indent=1))
    facts = machine_facts(())
    path = out / f"nas_arithmetic_{space_name}.{facts['backend']}.json"
    path.write_text(json.dumps({
        "benchmark": "nas_arithmetic", "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": facts, "settings": {"space": space_name, "plan": PLAN, "population_size": population_size},
        **measured}, indent=2) + "\n")
    print(f"written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default="nb201_digits", choices=[*sorted(rj.nas.models.EMBEDDED), "nb201"],
                        help="a digits space with its bundled supernet, or nb201 (CIFAR size: C=16, N=5, 32x32x3) "
                        "with a randomly initialised supernet on random images: throughput only")
    parser.add_argument("--networks", type=int, default=64, help="subnets through the population path")
    parser.add_argument("--alone", type=int, default=8, help="subnets evaluated one at a time")
    parser.add_argument("--population-size", type=int, default=64)
    parser.add_argument("--torch", type=int, default=8, help="subnets evaluated one at a time in PyTorch "
                        "(NB201 needs xautodl; 0: skip)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    parser.add_argument("--layout", default="auto", choices=rj.nas.population.LAYOUTS,
                        help="how a population runs (nas.population.choose_layout; default: %(default)s)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--scale", choices=["cifar"], help="cifar: --space nb201 --networks 32 --alone 1 --torch 2 "
                        "--population-size 16, 256 calibration images and no warm rows (NB201 C=16, N=5 on 32x32 "
                        "random images, sized for a 2-core CPU: about 14 minutes)")
    parser.add_argument("--arithmetic", action="store_true", help="only the FLOPs each layout executes over the "
                        "networks' own (8 networks) and, for NB201, the programs a sweep of all cells compiles; "
                        "nothing timed")
    args = parser.parse_args()
    if args.arithmetic:
        return write_arithmetic(args.space, args.population_size, args.out)
    calibration_images, warm = CALIBRATION_IMAGES, True
    if args.scale == "cifar":
        args.space, args.networks, args.alone, args.torch, args.population_size = "nb201", 32, 1, 2, 16
        calibration_images, warm = CIFAR_CALIBRATION_IMAGES, False
    measured = measure(args.space, networks=args.networks, alone=args.alone, torch=args.torch,
                       population_size=args.population_size, threads=args.threads,
                       calibration_images=calibration_images, warm=warm, layout=args.layout)
    rows = measured["results"]
    if args.torch:
        print(f"the machine's ceiling is {rows['machine_ceiling']['networks_per_hour'] / rows['torch']['networks_per_hour']:.1f}x "
              f"torch's networks per hour ({rows['machine_ceiling']['gflop_per_network']} GFLOP per network at "
              f"{rows['machine_ceiling']['peak_gflops']} GFLOP/s)")
    for name, row in rows.items():
        print(f"{name:12s} {row['networks']:5d} networks  {row['seconds']:8.1f} s  {row['compiles'] or '-':>5} compiles  "
              f"{row['networks_per_hour']:8d} networks/hour")
    print(f"population over the others (networks per hour): {measured['population_over']}; results equal on the "
          f"shared networks: {measured['results_equal']}")
    print(f"population size each item runs at: {measured['population_size_run']}; peak memory "
          f"{measured['peak_rss_mib']} MiB")
    args.out.mkdir(parents=True, exist_ok=True)
    facts = machine_facts(())
    layout = "" if args.layout == "auto" else f"_{args.layout}"
    path = args.out / f"nas_{args.space}{layout}.{facts['backend']}.json"
    path.write_text(json.dumps({
        "benchmark": "nas", "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": facts, "settings": {"space": args.space, "plan": PLAN, "population_size": args.population_size,
                                       "layout": choose_layout(args.layout, args.population_size,
                                                               rj.nas.space(args.space)),
                                       "calibration_images": calibration_images, "scale": args.scale},
        **measured}, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
