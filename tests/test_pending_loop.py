"""ops.pending.while_pending: the plain loop's results, with work that follows each example's
own number of iterations rather than the slowest example's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from robustjax.ops.pending import halving_sizes, while_pending

NEEDS = np.random.default_rng(0).integers(0, 30, size=50)
STRIDES = np.arange(50) % 3 + 1


def _count_to(needs, limit, strides=jnp.asarray(STRIDES)):
    """Each example counts by its stride (an input) until it reaches its need, over a ladder
    down to 4; ``visits`` counts the steps computed on each example's row."""

    def step(i, state, stride):
        count, visits, need = state
        return count + stride * (count < need), visits + 1, need

    start = (jnp.zeros(needs.shape, needs.dtype), jnp.zeros(needs.shape, needs.dtype), needs)
    count, visits, _ = while_pending(step, lambda state: state[0] < state[2], start, strides, limit, smallest=4)
    return count, visits


def _expected(needs, limit):
    return np.minimum(-(-needs // STRIDES), limit) * STRIDES


def test_halving_sizes():
    assert halving_sizes(250) == (250, 125, 63, 32, 16)
    assert halving_sizes(40) == (40, 20) and halving_sizes(4) == (4,)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="smallest"):
        halving_sizes(8, 0)  # would halve forever
    with pytest.raises(ValueError, match="limit"):
        _count_to(jnp.asarray(NEEDS), -1)
    with pytest.raises(ValueError, match="inputs"):
        while_pending(lambda i, s, x: s, lambda s: s > 0, jnp.zeros(3), (), 5)


def test_each_example_gets_its_own_iterations_and_about_its_own_work():
    count, visits = jax.jit(_count_to, static_argnums=1)(jnp.asarray(NEEDS), 100)
    np.testing.assert_array_equal(count, _expected(NEEDS, 100))
    own = -(-NEEDS // STRIDES)  # the iterations each example needs
    assert np.all(np.asarray(visits) >= own)
    plain = NEEDS.size * own.max()  # every example stepped until the slowest is done
    assert visits.sum() <= 2 * (own.sum() + NEEDS.size), (visits.sum(), own.sum())
    assert visits.sum() < 0.75 * plain, (visits.sum(), plain)


def test_the_limit_stops_every_example():
    count, _ = _count_to(jnp.asarray(NEEDS), 7)
    np.testing.assert_array_equal(count, _expected(NEEDS, 7))


def test_vmapped_over_populations_each_gets_its_own_result():
    needs = np.stack([NEEDS, NEEDS[::-1] // 2])
    count, _ = jax.vmap(_count_to, in_axes=(0, None))(jnp.asarray(needs), 100)
    np.testing.assert_array_equal(count, [_expected(n, 100) for n in needs])


def test_inside_shard_map_each_shard_runs_its_own_examples():
    """Over the 8 simulated devices, each shard's loop starts from constants (the counts)
    and steps its own examples: the unsharded results."""
    mesh = jax.make_mesh((8,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
    needs, strides = NEEDS[:48], STRIDES[:48]
    sharded = jax.shard_map(lambda n, s: _count_to(n, 100, s)[0], mesh=mesh, in_specs=P("batch"), out_specs=P("batch"))
    count = sharded(*jax.device_put((jnp.asarray(needs), jnp.asarray(strides)), NamedSharding(mesh, P("batch"))))
    np.testing.assert_array_equal(count, -(-needs // strides) * strides)
