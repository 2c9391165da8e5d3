"""The ``Registry`` helper behind every registry (tests/test_registries.py checks that each
family offers it the same way)."""

import pytest

from robustjax.registry import Registry


@pytest.fixture
def registry() -> Registry[int]:
    registry = Registry("widget")
    for value, name in enumerate(("pgd", "fgsm", "apgd")):
        assert registry.register(name, value) == value
    return registry


def test_holds_values_in_registration_order(registry):
    assert registry.names() == ["pgd", "fgsm", "apgd"] == list(registry)
    assert (registry.get("fgsm"), registry["apgd"], len(registry)) == (1, 2, 3)
    assert "pgd" in registry and "cw" not in registry


def test_refuses_a_second_value_under_one_name(registry):
    with pytest.raises(ValueError, match="widget 'pgd' is already registered"):
        registry.register("pgd", 3)
    assert registry["pgd"] == 0


def test_unknown_names_get_suggestions_and_the_sorted_listing(registry):
    listing = r"known widgets: \['apgd', 'fgsm', 'pgd'\]"
    with pytest.raises(ValueError, match=rf"^unknown widget 'pgdd' \(did you mean 'pgd', 'apgd'\?\); {listing}$"):
        registry.get("pgdd")
    with pytest.raises(ValueError, match=rf"^unknown widget 'zzz'; {listing}$"):
        registry["zzz"]
