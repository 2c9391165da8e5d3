"""Packed NAS-Bench-201 populations (``nas.nb201_packed``): each edge runs each op once on the
examples of the networks that chose it, giving every network the logits and attack outcomes
it gets side by side with masks, at about its own arithmetic, one program per signature.
(Packed through the engine, ``evaluate_population``: the compile count below.)"""

import jax
import numpy as np
import pytest

import robustjax as rj
from robustjax.cli import main
from robustjax.evaluation import items
from robustjax.evaluation.plan import plan_from_dict
from robustjax.evaluation.population import evaluate_population
from robustjax.nas import nb201_packed
from robustjax.nas.nb201 import OPS, NB201Config
from robustjax.nas.nb201_packed import PackedChoice, packed_edge, packing_order, signature_of
from robustjax.nas.population import from_supernet, over_networks
from robustjax.sweep import Store, Sweep, engine, export
from tests.helpers import assert_same_pgd_outcomes, count_compiles, gradient_flops_by_layout

PLAN = plan_from_dict({"batch_size": 16, "num_examples": 16, "sanity": {"enabled": False}, "attacks": [
    {"name": "fgsm", "eps": 0.1}, {"name": "pgd", "eps": [0.05, 0.1], "steps": 3}]})


def rotations(shift: int) -> list[NB201Config]:
    """Five cells that share no op on any edge: cell k takes op (k + shift * edge) mod 5 on each
    edge, so each op is taken once per edge (signature all ones, whatever ``shift``)."""
    return [NB201Config(tuple(OPS[(k + shift * edge) % 5] for edge in range(6))) for k in range(5)]


@pytest.fixture(scope="module")
def supernet():
    return rj.nas.bundled_supernet("nb201_digits")


@pytest.fixture(scope="module")
def calibration():
    return rj.nas.calibration_subset(rj.data.digits("train"), 256)


def logits(population, images):
    return np.asarray(population.map(lambda classifier, x: classifier(x), images))


@pytest.mark.parametrize("archs", ["sampled", "sharing_nothing"])
def test_packed_networks_get_the_logits_and_attack_outcomes_of_masks(supernet, calibration, archs):
    archs = supernet.space.sample(jax.random.key(3), 6) if archs == "sampled" else rotations(1)
    signature = signature_of(np.stack([a.op_indices() for a in archs]))
    assert 1 in {count for edge in signature for count in edge}  # some network is alone in its op group
    masks, packed = (from_supernet(supernet, archs, calibration=calibration, packed=p) for p in (False, True))
    images, labels = rj.data.digits("test").arrays(limit=16)
    np.testing.assert_allclose(logits(packed, images), logits(masks, images), atol=1e-5, rtol=1e-5)
    assert_same_pgd_outcomes(masks, packed, images, labels)


def test_packed_populations_execute_about_their_networks_own_flops(supernet):
    """XLA's cost analysis of a PGD step's gradient: packed within 1.2x the networks' own,
    where masks run every op of every edge."""
    archs = supernet.space.sample(jax.random.key(4), 5)
    images, labels = rj.data.digits("test").arrays(limit=16)

    flops = gradient_flops_by_layout(supernet, archs, images, labels)
    assert flops["packed"] <= 1.2 * flops["own"]
    assert flops["masks"] >= 2.5 * flops["own"]


def test_a_population_of_the_same_signature_compiles_nothing(supernet):
    first, second = rotations(1), rotations(2)
    assert {a.arch_id for a in first}.isdisjoint(a.arch_id for a in second)
    dataset, plan = rj.data.digits("test"), plan_from_dict({"batch_size": 8, "num_examples": 8, "attacks": [
        {"name": "fgsm", "eps": 0.1}], "sanity": {"enabled": False}})
    evaluate_population(supernet, first, dataset, plan, population_size=5, layout="packed")
    with count_compiles() as compiles:
        results = evaluate_population(supernet, second, dataset, plan, population_size=5, layout="packed")
    assert compiles[0] == 0 and [r["arch_id"] for r in results] == [a.arch_id for a in second]


def test_a_part_of_a_packed_population_takes_its_own_signature(supernet):
    archs = rotations(1)
    population = from_supernet(supernet, archs, packed=True)
    part = items._select(population.classifier.params, population.axes, [0, 2, 2])[2]
    assert isinstance(part, PackedChoice)
    np.testing.assert_array_equal(part.indices, np.stack([archs[i].op_indices() for i in (0, 2, 2)]))
    assert part.signature == signature_of(part.indices) and sum(part.signature[0]) == 3


def test_packed_is_refused_where_it_cannot_pack(supernet, tmp_path):
    with pytest.raises(ValueError, match="cannot split networks over network_shards"):
        evaluate_population(supernet, rotations(1), rj.data.digits("test"), PLAN, layout="packed",
                            network_shards=2)
    with pytest.raises(ValueError, match="standalone networks .* have their own"):
        Sweep(PLAN, space="nb201_digits", weights=str(tmp_path), layout="packed")
    population = from_supernet(supernet, rotations(1), packed=True)
    images = rj.data.digits("test").arrays(limit=4)[0]
    with pytest.raises(TypeError, match="no gradient with respect to the supernet's weights"):
        jax.grad(lambda params: logits_sum(population, params, images))(population.classifier.params[0])


def logits_sum(population, shared, images):
    params = (shared, *population.classifier.params[1:])
    return over_networks(lambda p: population.classifier.replace(params=p)(images).sum(), params,
                         population.axes).sum()


@pytest.mark.parametrize("population_size", [25, 125, 50])
def test_every_cell_in_packing_order_forms_populations_of_one_signature(population_size):
    space = rj.nas.space("nb201_digits")
    cells = [space.config(index) for index in range(len(space))]
    ordered = packing_order(cells, population_size)
    assert sorted(c.arch_id for c in ordered) == sorted(c.arch_id for c in cells)
    found = {signature_of(np.stack([c.op_indices() for c in ordered[start:start + population_size]]))
             for start in range(0, len(ordered) - population_size + 1, population_size)}  # the full ones
    assert found == {((population_size // 5,) * 5,) * 6}
    # of a subset, whole cosets first and then the rest, every cell kept once
    subset = cells[::3]
    assert sorted(c.arch_id for c in packing_order(subset, 25)) == sorted(c.arch_id for c in subset)
    with pytest.raises(ValueError, match="population_size must be an integer >= 1, got 0"):
        packing_order(subset, 0)
    with pytest.raises(TypeError, match="orders NAS-Bench-201 cells"):
        packing_order([0, 1], 25)


def test_a_packed_sweep_from_the_command_line_gives_the_figures_of_masks(supernet, tmp_path, monkeypatch):
    cells, layouts = rotations(1), []
    def recorded(*args, **kwargs):
        layouts.append("packed" if kwargs.get("packed") else "other")
        return from_supernet(*args, **kwargs)

    monkeypatch.setattr(engine, "from_supernet", recorded)
    plan = tmp_path / "plan.toml"
    plan.write_text('batch_size = 8\nnum_examples = 8\n[sanity]\nenabled = false\n'
                    '[[attacks]]\nname = "fgsm"\neps = 0.1\n')
    ids = ",".join(str(cell.index) for cell in cells)
    db = str(tmp_path / "s.sqlite")
    assert main(["sweep", "run", "--db", db, "--space", "nb201_digits", "--ids", ids, "--plan", str(plan),
                 "--layout", "packed", "--population-size", "5", "--calibration-images", "64", "--quiet"]) == 0
    assert layouts == ["packed"]  # one population of the five cells
    rows = {row["arch_id"]: row for row in export.table(Store.read(db)).rows}
    calibration = rj.nas.calibration_subset(rj.data.digits("train"), 64)
    masks = evaluate_population(supernet, cells, rj.data.digits("test"), plan_from_dict(
        {"batch_size": 8, "num_examples": 8, "sanity": {"enabled": False}, "attacks": [{"name": "fgsm", "eps": 0.1}]}),
        calibration=calibration, layout="masks")
    assert sorted(rows) == sorted(result["arch_id"] for result in masks)
    for result in masks:
        row = rows[result["arch_id"]]
        assert row["clean"] == result["clean_accuracy"]
        assert row["fgsm eps=0.1"] == result["attacks"][0]["robust_accuracy"]


@pytest.mark.parametrize("counts", [(0, 1, 1, 2, 1), (0, 1, 1, 2, 2)], ids=["packed", "other networks"])
def test_an_edge_shared_by_networks_gives_each_its_own_op(counts):
    """Images shared by the networks (unbatched under vmap), with the signature of the five
    networks or with one of more networks (the per-network fallback)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 4, 4, 3)).astype(np.float32)
    kernels = (rng.normal(size=(1, 1, 3, 3)).astype(np.float32), rng.normal(size=(3, 3, 3, 3)).astype(np.float32))
    norms = tuple(tuple(rng.uniform(0.5, 1.5, (5, 3)).astype(np.float32) for _ in range(4)) for _ in range(2))
    ops = np.array([3, 1, 2, 4, 3])
    out = jax.vmap(lambda op, norm: packed_edge(counts)(x, op, kernels, norm))(ops, norms)
    for index, op in enumerate(ops):
        if op in (2, 3):
            scale, bias, mean, var = (v[index] for v in norms[op - 2])
            conv = jax.lax.conv_general_dilated(np.maximum(x, 0), kernels[op - 2], (1, 1), "SAME",
                                                dimension_numbers=("NHWC", "HWIO", "NHWC"))
            expected = (conv - mean) / np.sqrt(var + 1e-5) * scale + bias
        else:
            expected = x if op == 1 else nb201_packed.avg_pool_3x3(x)
        np.testing.assert_allclose(out[index], expected, atol=1e-5, rtol=1e-5, err_msg=f"network {index}")
