"""Registry-wide contract of the NAS search spaces: every registered space is checked here
(tests/test_nas_spaces.py checks each space against its published ids and costs)."""

import jax
import numpy as np
import pytest

import robustjax as rj

NAMES = rj.nas.names()


def seeded_indices(space) -> list[int]:
    """The first and the last id, and a few seeded ones."""
    return [0, len(space) - 1, *np.random.default_rng(0).integers(len(space), size=6).tolist()]


@pytest.mark.parametrize("name", NAMES)
def test_ids_round_trip_through_configs_with_a_cost(name):
    space = rj.nas.create(name)
    assert isinstance(space, rj.nas.SearchSpace) and space.name == name and rj.nas.space_doc(name)
    assert space == rj.nas.get(name)() == rj.nas.space(name)
    assert isinstance(len(space), int) and len(space) > 1
    indices = seeded_indices(space)
    configs = [space.config(i) for i in indices]
    assert [space.index(config) for config in configs] == indices
    assert [space.index(config.arch_id) for config in configs] == indices
    assert [space.config(i).arch_id for i in indices] == [config.arch_id for config in configs]
    assert len({config.arch_id for config in configs}) == len(set(indices))  # distinct networks, distinct ids
    for config in configs:
        hash(config)
        cost = space.cost(config)
        assert cost.params > 0 and cost.macs > 0 and cost.flops == 2 * cost.macs
    with pytest.raises(ValueError, match=rf"index {len(space)} is out of range"):
        space.config(len(space))


@pytest.mark.parametrize("name", NAMES)
def test_samples_are_seeded_valid_configs(name):
    space = rj.nas.create(name)
    sample = space.sample(jax.random.key(0), 4)
    assert len(sample) == 4 and len({config.arch_id for config in sample}) == 4
    for config in sample:
        assert space.config(space.index(config)) == config
    assert [c.arch_id for c in space.sample(jax.random.key(0), 4)] == [c.arch_id for c in sample]


@pytest.mark.parametrize("name", NAMES)
def test_unknown_names_are_refused_naming_the_close_ones(name):
    misspelt = name[:-1] + "Q" + name[-1]
    with pytest.raises(ValueError, match=rf"^unknown search space '{misspelt}' \(did you mean [^)]*'{name}'"):
        rj.nas.create(misspelt)
    with pytest.raises(ValueError, match="'no_such_network'"):  # an arch name the space does not know
        rj.nas.create(name).index("no_such_network")
