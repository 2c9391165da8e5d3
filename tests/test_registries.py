"""Every named family offers one registry API: ``names()``, ``get(name)`` and
``create(name, ...)``, with the same "did you mean" error for a misspelt name (each
family's own contract file checks its entries)."""

import re
import types

import pytest

import robustjax as rj
from robustjax import builtin_plans
from robustjax.evaluation import plan
from robustjax.registry import unknown_name

# The kind its errors name -> the namespace offering the verbs, and what ``create`` needs
# besides the name.
FAMILIES = {
    "attack": (rj.attacks, {}),
    "corruption": (rj.noise, {"severity": 1, "preset": "cifar"}),
    "model": (rj.zoo, {"pretrained": False}),
    "search space": (rj.nas, {}),
    # listed and read without the evaluation code (the command line's help), created a layer above
    "plan": (types.SimpleNamespace(names=builtin_plans.names, get=builtin_plans.get, create=plan.create), {}),
    "technique": (rj.training.techniques, {}),
    "perturbation": (rj.noise.sequences, {"preset": "cifar"}),
}


@pytest.mark.parametrize("kind", FAMILIES)
def test_every_family_offers_the_same_verbs(kind):
    family, _ = FAMILIES[kind]
    assert all(callable(getattr(family, verb, None)) for verb in ("names", "get", "create")), kind
    names = family.names()
    assert isinstance(names, list) and names and all(isinstance(name, str) for name in names)
    assert len(set(names)) == len(names), f"{kind}: a name listed twice"
    for name in names:
        assert family.get(name) is not None


@pytest.mark.parametrize("kind", FAMILIES)
def test_a_misspelt_name_gets_the_same_did_you_mean_error(kind):
    family, create_arguments = FAMILIES[kind]
    names = family.names()
    name = names[len(names) // 2]
    misspelt = name[:-1] + "Q" + name[-1]
    assert misspelt not in names
    expected = str(unknown_name(kind, misspelt, names))
    pattern = rf"^unknown {kind} '{re.escape(misspelt)}' \(did you mean [^)]*'{re.escape(name)}'[^)]*\?\); known {kind}s: \["
    assert re.match(pattern, expected)
    for verb, arguments in (("get", {}), ("create", create_arguments)):
        with pytest.raises(ValueError) as error:
            getattr(family, verb)(misspelt, **arguments)
        assert str(error.value) == expected, f"{kind}.{verb}"
