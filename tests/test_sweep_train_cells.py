"""Sweeps that train NAS-Bench-201 cells from scratch (issue 39): `sweep run --space nb201_digits
--train pgd_at` trains a chunk's cells in populations, a killed training resumes to the
weights of an uninterrupted population, each cell is evaluated from its own folder, and the
export rows carry the NB201 ids, the techniques and the training's last figures."""

import contextlib
import dataclasses
import io
import json

import jax
import numpy as np
import pytest

import robustjax as rj
from robustjax.cli import main
from robustjax.evaluation.items import ItemRunner, expand
from robustjax.evaluation.parallel import DataParallel
from robustjax.evaluation.plan import SanityRun
from robustjax.nas.population import Population
from robustjax.sweep import Store, Sweep, export, open_store, run_local, trained_cells
from robustjax.sweep.engine import context
from robustjax.training import aligned

CELLS = (5, 11472)
PLAN = """
batch_size = 32
num_examples = 32
[training]
techniques = ["baseline"]
steps = 4
batch_size = 16
learning_rate = 0.05
attack_eps = 0.2
attack_steps = 1
checkpoint_every = 2
"""


def _argv(tmp, *extra):
    (tmp / "plan.toml").write_text(PLAN)
    return ["sweep", "run", "--space", "nb201_digits", "--ids", ",".join(map(str, CELLS)), "--train", "pgd_at",
            "--plan", str(tmp / "plan.toml"), "--db", str(tmp / "s.sqlite"), "--compile-cache", "off", *extra]


def _sweep(tmp) -> Sweep:
    plan = rj.evaluation.load_plan(tmp / "plan.toml")
    training = dataclasses.replace(plan.training, techniques=(rj.training.techniques.create("pgd_at"),))
    return Sweep(plan=dataclasses.replace(plan, training=training), space="nb201_digits",
                 trained_dir=f"{tmp / 's.sqlite'}.trained")


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """The sweep killed at training step 3 (last checkpoint at 2), then run whole by the CLI;
    and what the CLI printed. One cell to a population, so the two cells are two populations,
    as when a sweep's chunk holds more cells than a population."""
    tmp = tmp_path_factory.mktemp("cells")
    (tmp / "plan.toml").write_text(PLAN)
    sweep = _sweep(tmp)
    store, selection = open_store(sweep, str(tmp / "s.sqlite"), list(CELLS))

    def kill(arch_id, report):
        if report.step == 3:
            raise Killed

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trained_cells, "UNROLLED_CELLS", 1)
        with pytest.raises(Killed):
            run_local(sweep, store, selection, worker="w", on_train=kill)
        assert not store.done()
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            assert main(_argv(tmp)) == 0
    return tmp, Store.read(tmp / "s.sqlite"), " ".join(printed.getvalue().split())


def test_a_killed_cell_population_resumes_to_the_uninterrupted_weights(swept, tmp_path):
    """The rerun resumes the first cell's population at step 3, and each cell's folder holds
    the weights and last loss the cell gets in a population of its own trained without
    interruption (itself its solo run, test_training_population)."""
    tmp, store, printed = swept
    first = next(arch_id for arch_id, _, _ in store.networks())
    assert f"resuming {first}: step 3/4" in printed
    recipe = aligned("nas_nb201", rj.training.techniques.create("pgd_at"), steps=4, batch_size=16,
                     learning_rate=0.05)
    (folder,) = {p.parent.parent for p in (tmp / "s.sqlite.trained").rglob("card.json")}
    assert not (folder / "populations").exists()  # a finished population's checkpoints are gone
    for cell in CELLS:
        network = rj.zoo.create("nas.nb201_digits", pretrained=False, key=jax.random.key(0), arch=cell)
        whole = rj.training.train_population([network], rj.data.digits("train"), tmp_path / str(cell), recipe,
                                             rj.training.techniques.create("pgd_at"), seeds=[0], attack_eps=0.2,
                                             attack_steps=1, layout="unrolled")  # the layout "auto" takes on the CPU
        got = rj.zoo.create("nas.nb201_digits", arch=cell, weights=folder / str(cell))
        jax.tree.map(np.testing.assert_array_equal, got.params, whole.classifiers[0].params)
        card = json.loads((folder / str(cell) / "card.json").read_text())["training"]
        assert card["final_metrics"]["loss"] == whole.last_metrics["loss"][0] and card["stopped_at"] is None


def test_cells_are_evaluated_from_their_folders_and_exported_with_their_training(swept):
    tmp, store, _ = swept
    networks = {arch_id: card for arch_id, _, card in store.networks()}
    assert [card["index"] for card in networks.values()] == list(CELLS)
    plan = dataclasses.replace(_sweep(tmp).plan, training=None, sanity=SanityRun(enabled=False))
    runner = ItemRunner(rj.data.digits("test"), plan, DataParallel(plan.batch_size))
    (item,) = [i for i in expand(plan) if i.kind == "clean"]
    rows = {r["arch_id"]: r for r in store.results() if r["item_key"] == item.key_for(plan)}
    for arch_id, card in networks.items():
        folder = tmp / "s.sqlite.trained" / arch_id.split("/", 1)[1] / str(card["index"])
        alone = rj.zoo.create("nas.nb201_digits", arch=card["index"], weights=folder)
        outcome = runner.run(item, Population.stack([alone]).classifier, 0)[0]
        np.testing.assert_array_equal(rows[arch_id]["outcome"], outcome)
    table = export.table(store)
    assert "cells trained from scratch" in table.context
    for row in table.rows:
        trained_card = json.loads((tmp / "s.sqlite.trained" / row["arch_id"].split("/", 1)[1] / str(row["index"])
                                   / "card.json").read_text())["training"]
        assert row["techniques"] == "pgd_at" and row["train_steps"] == 4 and row["diverged_at"] is None
        assert row["train_loss"] == trained_card["final_metrics"]["loss"] and np.isfinite(row["train_loss"])
        assert row["arch_id"].startswith(f"nb201:{row['index']}/nas.nb201_digits/pgd_at/")


def test_a_rerun_trains_and_evaluates_nothing(swept, monkeypatch):
    tmp, store, _ = swept
    monkeypatch.setattr(rj.training, "train_population", lambda *a, **k: pytest.fail("trained again"))
    monkeypatch.setattr(ItemRunner, "run", lambda *a, **k: pytest.fail("evaluated again"))
    assert main(_argv(tmp, "--quiet")) == 0
    context(_sweep(tmp)).train([arch_id for arch_id, _, _ in store.networks()])  # a trained cell is read back


@pytest.mark.parametrize("extra, message", [
    (["--space", "bignas_resnet_basic_digits"], "bignas_resnet_basic_digits is not a NAS-Bench-201 space"),
    (["--train", "dropout"], "technique 'dropout' needs dropout"),
    (["--train", "pgd_at,bogus"], "bogus"),
    (["--weights", "."], "--weights and --supernet give networks already trained"),
    (["--layout", "packed"], "layout 'packed' runs subnets that share a supernet's weights"),
])
def test_sweeps_that_cannot_train_cells_are_refused(tmp_path, capsys, extra, message):
    argv = _argv(tmp_path, "--quiet")
    for flag in ("--space", "--train"):
        if flag in extra:
            i = argv.index(flag)
            del argv[i:i + 2]
    assert main(argv + extra) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "s.sqlite").exists()



def test_cells_train_in_the_layout_the_sweep_names():
    """auto on the CPU: each cell at its own shapes, a few to a program; masks: side by side;
    sequential: in turn; packed (for subnets sharing weights) is not a training layout."""
    assert jax.default_backend() == "cpu"
    assert [trained_cells.layout(name) for name in ("auto", "masks", "sequential")] == ["unrolled", "vmap",
                                                                                       "sequential"]
    with pytest.raises(ValueError, match="train under layout auto, masks or sequential; got 'packed'"):
        trained_cells.layout("packed")
