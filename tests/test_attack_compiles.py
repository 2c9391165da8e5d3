"""Epsilons and step sizes are arguments of the compiled programs (issue 37, item 4): a new
value, given as a Python float, a NumPy float32 or a JAX scalar, concrete or traced,
compiles nothing new and gives the result of the Python float, in a call and in a sweep."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec

import robustjax as rj
from robustjax.attacks import compaction
from robustjax.attacks.base import split_traceable
from tests.helpers import count_compiles


def nearby(value: float) -> tuple[float, float, float]:
    """Three values close enough to fool the same examples at the same steps, so that
    compacted runs meet the same batch sizes."""
    return value, 1.01 * value, 1.02 * value


# Every registered attack: a small budget, and three values of each traceable field (eps and
# step sizes), the first also in the budget so that every test of an attack shares its
# programs. Only AutoAttack's first component fools examples at these epsilons, so it gives
# the same result on concrete arrays (each component on the still-robust examples) and
# traced (every component on the whole batch). A new attack must be added here.
ATTACKS = {
    "apgd": (dict(eps=0.03, steps=3), {"eps": nearby(0.03)}),
    "autoattack": (dict(eps=0.03, steps=2, target_classes=2, square_queries=20, checks="off"), {"eps": nearby(0.03)}),
    "boundary": (dict(max_queries=60), {}),
    "cw_l2": (dict(steps=3, binary_search_steps=2), {"initial_const": nearby(0.01), "learning_rate": nearby(0.01)}),
    "deepfool": (dict(steps=3), {}),
    "fab": (dict(eps=0.02, steps=3), {"eps": (0.02, 0.04, 0.06)}),  # success within eps: values a boundary apart
    "fgsm": (dict(eps=0.03), {"eps": nearby(0.03)}),
    "hop_skip_jump": (dict(max_queries=60), {}),
    "mifgsm": (dict(eps=0.03, steps=3, step_size=0.01), {"eps": nearby(0.03), "step_size": nearby(0.01)}),
    "nes": (dict(eps=0.03, step_size=0.01, max_queries=60, samples=4), {"eps": nearby(0.03),
                                                                        "step_size": nearby(0.01)}),
    "pgd": (dict(eps=0.03, steps=3, step_size=0.01), {"eps": nearby(0.03), "step_size": nearby(0.01)}),
    "rays": (dict(eps=0.05, max_queries=60), {"eps": (0.05, 0.1, 0.2)}),  # a stopping radius: values that stop sooner
    "sign_opt": (dict(max_queries=80), {}),
    "simba": (dict(step_size=0.05, max_queries=60), {"step_size": nearby(0.05)}),
    "spsa": (dict(eps=0.03, max_queries=60, samples=2), {"eps": nearby(0.03), "learning_rate": nearby(0.01)}),
    "square": (dict(eps=0.03, max_queries=60), {"eps": nearby(0.03)}),
}
CASES = [(name, field) for name, (_, fields) in ATTACKS.items() for field in fields]
SWEPT = [name for name, (_, fields) in ATTACKS.items() if "eps" in fields]


def attack_with(name: str, **values) -> rj.attacks.Attack:
    return rj.attacks.create(name, **ATTACKS[name][0] | values)


@functools.partial(jax.jit, static_argnums=0)
def one_program(name: str, values: dict, classifier, x, y, key):
    """The attack called inside a user's ``jax.jit`` with traced ``values`` of its fields
    (every traceable one, so that all tests of an attack share the program)."""
    return attack_with(name, **values)(classifier, x, y, key=key)


def traced_values(name: str, **values) -> dict:
    return {field: jnp.float32(values.get(field, first)) for field, (first, _, _) in ATTACKS[name][1].items()}


def assert_results_close(actual, expected, exact: bool = False):
    for got, want in zip(actual, expected, strict=True):
        if exact or want.dtype != np.float32:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, atol=1e-5)


def test_the_table_lists_every_attack_and_its_traceable_fields():
    assert sorted(ATTACKS) == sorted(rj.attacks.names())
    for name, (_, fields) in ATTACKS.items():
        cls = rj.attacks.get(name)
        assert set(fields) == set(cls.traceable), name
        assert all(getattr(attack_with(name), field) == values[0] for field, values in fields.items()), name
        assert "eps" in cls.traceable or "eps" not in {f.name for f in dataclasses.fields(cls)}, name


def test_the_static_half_is_the_same_for_any_values_and_keeps_none():
    halves = [split_traceable(rj.attacks.PGD(eps=eps, step_size=0.01)) for eps in (0.1, np.float32(0.2), jnp.ones(()))]
    assert len({static for static, _ in halves}) == 1
    assert all(fields["eps"].dtype == np.float32 and fields["eps"].shape == () for _, fields in halves)
    static, fields = split_traceable(rj.attacks.PGD(step_size=None))
    assert static.step_size is None and set(fields) == {"eps"}


@pytest.mark.parametrize(("name", "field"), CASES)
def test_a_new_value_compiles_nothing_and_a_traced_one_gives_the_float_result(name, field, linear, batch, key):
    first, second, third = ATTACKS[name][1][field]

    def run(value):
        return attack_with(name, **{field: value})(linear, *batch, key=key)

    before = run(first)  # compiles the programs, compaction's batch sizes included
    second, concrete = np.float32(second), jnp.float32(third)
    with count_compiles() as compiles:
        run(second)
        concrete = run(concrete)
        as_float = run(third)
    assert compiles[0] == 0
    assert_results_close(concrete, as_float, exact=True)
    assert any(not np.array_equal(a, b) for a, b in zip(before, as_float)), f"{field} changes nothing"

    one_program(name, traced_values(name, **{field: second}), linear, *batch, key)
    values = traced_values(name, **{field: third})
    with count_compiles() as compiles:
        inside = one_program(name, values, linear, *batch, key)
    assert compiles[0] == 0
    assert_results_close(inside, as_float)


@pytest.mark.parametrize("name", sorted({name for name, _ in CASES}))
def test_traced_fields_trace_inside_shard_map(name, linear, batch, key):
    """The fields as replicated arguments of a user's ``shard_map`` (tracing only)."""
    mesh = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Auto,))
    specs = (PartitionSpec("batch"),) * 2 + (PartitionSpec(),) * 3
    mapped = jax.jit(jax.shard_map(lambda x, y, c, k, values: attack_with(name, **values)(c, x, y, key=k).x_adv,
                                   mesh=mesh, in_specs=specs, out_specs=PartitionSpec("batch")))
    assert mapped.trace(*batch, linear, key, traced_values(name)).out_info.shape == batch[0].shape


@pytest.mark.parametrize("name", SWEPT)
def test_a_sweep_passes_every_field_and_a_new_grid_compiles_nothing(name, linear, batch, key, monkeypatch):
    """Compacted attacks sweep as a nested search (which must take their step sizes with
    each epsilon), the others as one program."""
    fields = ATTACKS[name][1]
    low, middle, high = fields["eps"]
    attack = attack_with(name, **{field: values[2] for field, values in fields.items()})  # eps outside the grid
    nested, original = [], compaction.nested_sweep
    monkeypatch.setattr(compaction, "nested_sweep", lambda *args: nested.append(args) or original(*args))
    swept = attack.sweep(linear, *batch, key=key, eps=(middle, low))
    with count_compiles() as compiles:
        again = attack.sweep(linear, *batch, key=key, eps=(high, low))
    assert compiles[0] == 0
    assert bool(nested) == (isinstance(attack, compaction.Segmented) and attack.compactable)
    assert_results_close([leaf[1] for leaf in again], [leaf[1] for leaf in swept], exact=True)
    alone = dataclasses.replace(attack, eps=low)(linear, *batch, key=jax.random.split(key, 1)[0])
    assert_results_close([leaf[1] for leaf in swept], alone)

