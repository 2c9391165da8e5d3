"""Sweeps over a grid of training techniques (a plan's [training] table, issue 21): each
technique set trains once, the trained networks of one architecture are evaluated as one
population with the rows of each network evaluated alone, nothing runs twice, a killed
training resumes to the uninterrupted weights, bad tables are refused naming the bad key,
and another recipe is another network."""

import dataclasses
import json

import jax
import numpy as np
import pytest

import robustjax as rj
from robustjax.cli import main
from robustjax.evaluation import evaluate, load_plan
from robustjax.evaluation.items import ItemRunner, expand
from robustjax.evaluation.parallel import DataParallel
from robustjax.evaluation.plan import SanityRun, plan_from_dict
from robustjax.nas.population import Population
from robustjax.sweep import Store, Sweep, export, open_store, trained
from robustjax.sweep.analyze import dimension_effects

PLAN = """
batch_size = 32
num_examples = 64
[[attacks]]
name = "fgsm"
eps = 0.1
[training]
techniques = ["baseline", "fast_at"]
steps = 24
batch_size = 32
learning_rate = 0.05
attack_eps = 0.2
checkpoint_every = 8
"""


def _sweep(tmp, plan_text=PLAN, *extra):
    (tmp / "plan.toml").write_text(plan_text)
    return main(["sweep", "run", "--models", "digits_mlp", "--plan", str(tmp / "plan.toml"),
                 "--db", str(tmp / "s.sqlite"), "--compile-cache", "off", *extra])


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """The 2-technique grid swept once, with the networks each item ran on."""
    tmp = tmp_path_factory.mktemp("grid")
    calls = []
    original = ItemRunner.run
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ItemRunner, "run", lambda self, item, clf, axes, *rest, **k: calls.append(
            (item.kind, jax.tree.leaves(clf.params)[0].shape[0])) or original(self, item, clf, axes, *rest, **k))
        assert _sweep(tmp, PLAN, "--quiet") == 0
    return tmp, Store.read(tmp / "s.sqlite"), calls


def test_a_technique_grid_trains_each_set_and_evaluates_them_as_one_population(grid):
    tmp, store, calls = grid
    assert calls == [("clean", 2), ("attack", 2)]  # one program per item for the whole grid
    networks = {arch_id: card for arch_id, _, card in store.networks()}
    assert [card["techniques"] for card in networks.values()] == ["baseline", "fast_at"]
    rows = {(r["arch_id"], r["item_key"]): r for r in store.results()}
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows.values())
    plan = dataclasses.replace(load_plan(tmp / "plan.toml"), training=None, sanity=SanityRun(enabled=False))
    test_set = rj.data.digits("test")
    runner = ItemRunner(test_set, plan, DataParallel(plan.batch_size))
    items = {item.key_for(plan): item for item in expand(plan)}
    clean, attack = (next(k for k, i in items.items() if i.kind == kind) for kind in ("clean", "attack"))
    for arch_id in networks:
        folder = tmp / "s.sqlite.trained" / arch_id
        card = json.loads((folder / "card.json").read_text())
        assert card["training"]["recipe"]["steps"] == 24 and card["training"]["network_id"] == arch_id
        assert list(card["training"]["techniques"]) == networks[arch_id]["training"]["techniques"]
        alone = rj.zoo.create("digits_mlp", weights=folder)
        report = evaluate(alone, test_set, plan)
        for key, item in items.items():
            outcome = runner.run(item, Population.stack([alone]).classifier, 0)[0]
            np.testing.assert_array_equal(rows[(arch_id, key)]["outcome"], outcome)
        assert rows[(arch_id, clean)]["figures"] == {"clean": report["clean"]["accuracy"]}
        assert rows[(arch_id, attack)]["figures"] == {"fgsm eps=0.1": report["attacks"][0]["robust_accuracy"]}
    table = export.table(store)
    assert [(r["model"], r["techniques"]) for r in table.rows] == [("digits_mlp", "baseline"),
                                                                   ("digits_mlp", "fast_at")]
    effects = {(e["value"], e["figure"]): e["mean"] for e in dimension_effects(table) if e["dimension"] == "techniques"}
    assert effects[("fast_at", "clean")] == table.rows[1]["clean"]


def test_a_rerun_trains_and_evaluates_nothing(grid, monkeypatch, capsys):
    tmp, store, _ = grid
    rows = store.status()["rows"]
    monkeypatch.setattr(trained, "train", lambda *a, **k: pytest.fail("trained again"))
    monkeypatch.setattr(ItemRunner, "run", lambda *a, **k: pytest.fail("evaluated again"))
    assert _sweep(tmp) == 0
    assert "2 done already; 2 items each; 0 to train" in " ".join(capsys.readouterr().out.split())
    assert store.status()["rows"] == rows


def test_a_killed_training_resumes_to_the_weights_of_an_uninterrupted_one(grid, tmp_path, monkeypatch, capsys):
    """The fast_at network alone, killed after 10 of 24 steps (last checkpoint at 8), then rerun."""
    grid_tmp, grid_store, _ = grid
    plan_text = PLAN.replace('["baseline", "fast_at"]', '["fast_at"]')
    real = rj.training.train

    def killed(*args, **kwargs):
        real(*args, **kwargs, stop_after=10)
        raise RuntimeError("killed")

    monkeypatch.setattr(rj.training, "train", killed)
    with pytest.raises(RuntimeError, match="killed"):
        _sweep(tmp_path, plan_text, "--quiet")
    monkeypatch.setattr(rj.training, "train", real)
    assert _sweep(tmp_path, plan_text) == 0
    (arch_id, _, _), = Store.read(tmp_path / "s.sqlite").networks()
    assert f"resuming {arch_id}: step 9/24" in " ".join(capsys.readouterr().out.split())
    resumed = rj.zoo.create("digits_mlp", weights=tmp_path / "s.sqlite.trained" / arch_id)
    whole = rj.zoo.create("digits_mlp", weights=grid_tmp / "s.sqlite.trained" / arch_id)
    jax.tree.map(np.testing.assert_array_equal, resumed.params, whole.params)
    figures = {r["item_key"]: r["figures"] for r in grid_store.results() if r["arch_id"] == arch_id}
    assert {r["item_key"]: r["figures"] for r in Store.read(tmp_path / "s.sqlite").results()} == figures


@pytest.mark.parametrize("table, message", [
    ({"techniques": ["baseline", "fgsm"]}, r"training.techniques\[1\]: unknown technique 'fgsm'.*known techniques: "
                                           r"\['adamw'"),
    ({"techniques": ["pgd_at,trades"]}, r"training.techniques\[0\]: techniques 'pgd_at' and 'trades' cannot combine"),
    ({"techniques": ["", "baseline"]}, r"training.techniques\[1\] \('baseline'\) repeats the technique set 'baseline'"),
    ({"techniques": "fast_at"}, r"training.techniques must be a non-empty list of technique sets"),
    ({"techniques": [3]}, r"training.techniques\[0\] must be a string of comma-separated technique names"),
    ({"stpes": 20}, r"\[training\]: unknown key\(s\) 'stpes' \(did you mean 'steps'\?\)"),
    ({"steps": 20, "epochs": 2}, r"training: give steps or epochs, not both"),
    ({"batch_size": 0}, r"training: batch_size must be an integer >= 1"),
    ({"learning_rate": "fast"}, r"training.learning_rate must be a number, got 'fast'"),
    ({"nesterov": 1}, r"training.nesterov must be true or false, got 1"),
    ({"attack_eps": 2}, r"training.attack_eps must be a number in \(0, 1\], got 2"),
    ({"split": ""}, r"training.split must be a non-empty string"),
    ({"checkpoint_every": 0}, r"training.checkpoint_every must be an integer >= 1"),
])
def test_bad_training_tables_are_refused_naming_the_key(table, message):
    with pytest.raises(ValueError, match=message):
        plan_from_dict({"attacks": [{"name": "fgsm", "eps": 0.1}], "training": table})


def test_commands_that_cannot_train_refuse_a_training_plan(tmp_path, capsys):
    (tmp_path / "plan.toml").write_text(PLAN)
    plan = str(tmp_path / "plan.toml")
    assert main(["plan", "check", plan]) == 0
    assert ("training of 2 technique set(s) (baseline; fast_at) on the sweep dataset (split train) with the aligned "
            "recipe and batch_size=32, learning_rate=0.05, steps=24, attack_eps=0.2") in capsys.readouterr().out
    for argv, message in [
        (["evaluate", "--model", "digits_mlp", "--plan", plan], "has a [training] table, which trains networks for a "
                                                                 "sweep: run it with `robustjax sweep run --models"),
        (["sweep", "run", "--db", str(tmp_path / "s.sqlite"), "--plan", plan, "--models", "digits_mlp",
          "--ray", "auto"], "run it without --ray"),
        (["sweep", "run", "--db", str(tmp_path / "s.sqlite"), "--plan", plan, "--models", "tests.helpers:x"],
         "trains zoo models; 'tests.helpers:x' is not one"),
    ]:
        assert main([*argv, "--quiet"] if argv[0] == "sweep" else argv) == 2
        err = capsys.readouterr().err
        assert message in " ".join(err.split()), err
    assert not (tmp_path / "s.sqlite").exists()


def test_techniques_a_model_has_no_layers_for_are_refused_before_any_training(tmp_path):
    """The baseline comes first in the grid, yet nothing trains: digits_mlp has no
    drop-path layers, and the grid says so before the sweep starts."""
    table = {"techniques": ["baseline", "drop_path"], "steps": 24, "batch_size": 32}
    run = plan_from_dict({"attacks": [{"name": "fgsm", "eps": 0.1}], "training": table}).training
    with pytest.raises(ValueError, match="technique 'drop_path' needs drop-path"):
        trained.grid(["digits_mlp"], run, "digits")


def test_another_recipe_is_another_network(tmp_path):
    """Ids hash the resolved training settings: any recipe change, or the attack's settings
    of an adversarial technique, makes new networks; the same settings keep their ids, and
    a database takes the new networks beside the old ones."""
    def ids(**change):
        table = {"techniques": ["baseline", "fast_at"], "steps": 24, "batch_size": 32, **change}
        run = plan_from_dict({"attacks": [{"name": "fgsm", "eps": 0.1}], "training": table}).training
        return [n.arch_id for n in trained.grid(["digits_mlp"], run, "digits")]

    base = ids()
    assert base == ids() and base[0].startswith("digits_mlp/baseline/") and base[1].startswith("digits_mlp/fast_at/")
    for change in [{"steps": 25}, {"seed": 1}, {"learning_rate": 0.1}, {"batch_size": 64},
                   {"techniques": ["no_ema", "fast_at,no_ema"]}, {"dataset": "other"}, {"split": "test"}]:
        assert not set(ids(**change)) & set(base), change
    eps = ids(attack_eps=0.2)
    assert eps[0] == base[0] and eps[1] != base[1]  # the baseline has no attack to change

    def opened(steps):
        plan = plan_from_dict({"attacks": [{"name": "fgsm", "eps": 0.1}], "num_examples": 16,
                               "training": {"techniques": ["baseline"], "steps": steps}})
        sweep = Sweep(plan, models=("digits_mlp",), trained_dir=str(tmp_path / "s.sqlite.trained"))
        return open_store(sweep, str(tmp_path / "s.sqlite"), [])

    (first,), (second,) = opened(24)[1], opened(30)[1]
    store = Store.read(tmp_path / "s.sqlite")
    assert first != second and [a for a, _, _ in store.networks()] == [first, second]
    assert [card["training"]["recipe"]["steps"] for _, _, card in store.networks()] == [24, 30]
