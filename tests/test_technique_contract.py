"""Registry-wide contract of the training techniques: every registered one is checked here
(tests/test_training*.py check what each does to a training run)."""

import pytest

from robustjax import training
from robustjax.training import techniques
from robustjax.training.techniques import ADVERSARIAL, MIXING

NAMES = techniques.names()


@pytest.mark.parametrize("name", NAMES)
def test_each_technique_is_a_described_set_of_its_own(name):
    technique = techniques.get(name)
    assert technique.name == name and technique.group in ("batch", "switch") and technique.description
    created = techniques.create(name)
    assert created == techniques.create([name]) == techniques.create(f" {name}, ")
    assert created.names == (name,) and name in created and str(created) == name
    assert created.adversarial == (name if name in ADVERSARIAL else None)
    assert created.mixing == ((name,) if name in MIXING else ())
    if name in ADVERSARIAL + MIXING:
        assert technique.group == "batch"
    assert isinstance(training.aligned("resnet", created), training.Recipe)


@pytest.mark.parametrize("name", NAMES)
def test_each_technique_combines_unless_both_decide_the_batch(name):
    with pytest.raises(ValueError, match="names a technique twice"):
        techniques.create([name, name])
    for other in NAMES:
        if other == name:
            continue
        both_batch = techniques.get(name).group == techniques.get(other).group == "batch"
        if both_batch and {name, other} != set(MIXING):
            with pytest.raises(ValueError, match=f"'{name}' and '{other}' cannot combine"):
                techniques.create([name, other])
        else:
            pair = techniques.create([name, other])
            assert pair == techniques.create(f"{other},{name}") and pair.names == tuple(sorted((name, other)))


def test_the_baseline_is_the_empty_set():
    assert techniques.create(None) == techniques.create("") == techniques.create([]) == training.Techniques()
    assert str(techniques.create(None)) == "baseline"
