import dataclasses
import json

import pytest

import robustjax as rj
from robustjax import builtin_plans
from robustjax.cli import main
from robustjax.evaluation.plan import create, default_plan, load_plan, plan_from_dict


def test_default_plans_hold_fgsm_and_pgd_at_three_epsilons():
    for dataset in ("digits/test", "cifar10/test"):
        plan = default_plan(dataset)
        assert [run.attack.name for run in plan.runs] == ["fgsm", "pgd"]
        assert plan.runs[1].attack.norm == "linf"
        assert all(len(run.eps) == 3 and run.swept for run in plan.runs)
    assert max(default_plan("digits/test").runs[1].eps) == 0.2
    assert max(default_plan("cifar10/test").runs[1].eps) == pytest.approx(8 / 255)


def test_toml_and_json_plans_expand_eps_lists(tmp_path):
    (tmp_path / "p.toml").write_text('batch_size = 16\nnum_examples = 40\n[[attacks]]\nname = "pgd"\neps = [0.1, 0.2]\nsteps = 3\nnorm = "l2"\n')
    (tmp_path / "p.json").write_text(json.dumps({"batch_size": 16, "num_examples": 40,
                                                 "attacks": [{"name": "pgd", "eps": [0.1, 0.2], "steps": 3, "norm": "l2"}]}))
    toml_plan, json_plan = load_plan(tmp_path / "p.toml"), load_plan(tmp_path / "p.json")
    assert toml_plan == json_plan
    (run,) = toml_plan.runs
    assert run.attack == rj.attacks.PGD(eps=0.1, steps=3, norm="l2") and run.eps == (0.1, 0.2)
    assert [entry["eps"] for entry in toml_plan.as_dict()["attacks"]] == [0.1, 0.2]
    assert toml_plan.as_dict()["attacks"][1]["restarts"] == 1


def test_a_single_epsilon_without_restarts_is_a_plain_call():
    plan = plan_from_dict({"attacks": [{"name": "fgsm", "eps": 0.1}, {"name": "pgd", "eps": 0.1, "restarts": 3}]})
    assert [run.swept for run in plan.runs] == [False, True]
    assert plan.runs[1].restarts == 3


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"batch": 3}, r"unknown key\(s\) 'batch' \(did you mean 'batch_size'\?\); allowed keys are"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({"num_examples": -5}, "num_examples must be an integer >= 1"),
        ({"seed": "x"}, "seed must be an integer"),
        ({"attacks": {"name": "pgd"}}, "must be a list"),
        ({"attacks": [{"eps": 0.1}]}, r"attacks\[0\] must be a table with a string 'name'"),
        ({"attacks": [{"name": "pgd", "eps": -1}]}, r"attacks\[0\] \(pgd\): eps must be finite and >= 0"),
        ({"attacks": [{"name": "fgsm", "eps": []}]}, "empty list"),
        ({"attacks": [{"name": "pgd", "steps": 0}]}, "steps must be an integer >= 1"),
        ({"attacks": [{"name": "cw"}]}, "unknown attack 'cw'"),
        ({"attacks": [{"name": "pgd", "nrm": "l2"}]}, r"no parameter\(s\) \['nrm'\]"),
        ({"attacks": [{"name": "pgd", "eps": [0.1, -0.2]}]}, "eps must be finite and >= 0"),
        ({"attacks": [{"name": "pgd", "restarts": 0}]}, r"attacks\[0\].restarts must be an integer >= 1"),
    ],
)
def test_malformed_plans_name_the_problem(raw, message):
    with pytest.raises(ValueError, match=message):
        plan_from_dict(raw)


def test_unreadable_plan_files(tmp_path):
    (tmp_path / "bad.toml").write_text("batch_size = = 3")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_plan(tmp_path / "bad.toml")
    with pytest.raises(ValueError, match=r"no plan file at '.*missing\.toml', and unknown plan '.*'; known plans: \["):
        load_plan(tmp_path / "missing.toml")
    with pytest.raises(ValueError, match=r"and unknown plan 'whitebx' \(did you mean 'whitebox'\?\)"):
        load_plan("whitebx")


def test_builtin_plans_load_by_name():
    assert {"default", "digits", "whitebox"} <= set(builtin_plans.names())
    whitebox = {run.attack.name for run in load_plan("whitebox").runs}
    assert whitebox >= {"fgsm", "pgd", "mifgsm", "cw_l2", "deepfool"}
    # `robustjax evaluate --help` offers the plans it runs: not the technique grid, which trains for a sweep.
    evaluation = builtin_plans.evaluation_plans()
    assert "techniques" in builtin_plans.names() and set(builtin_plans.names()) - set(evaluation) == {"techniques"}


@pytest.mark.parametrize("name", builtin_plans.names())
def test_plan_show_prints_the_built_in_plan_that_plan_check_accepts(name, tmp_path, capsys):
    """The contract of every built-in plan: it is valid, loads by name, and prints as a file
    that reads back as the same plan."""
    plan = create(name)
    assert plan == load_plan(name) and plan.runs
    assert main(["plan", "show", name]) == 0
    text = capsys.readouterr().out
    (tmp_path / "plan.toml").write_text(text)
    assert load_plan(tmp_path / "plan.toml") == load_plan(name)
    assert main(["plan", "check", str(tmp_path / "plan.toml")]) == 0
    assert "a valid plan" in capsys.readouterr().out


def test_plan_check_names_the_unknown_key_its_table_and_the_nearest_valid_one(tmp_path, capsys):
    (tmp_path / "plan.toml").write_text('[[attacks]]\nname = "fgsm"\neps = 0.1\n[sanity]\nstpes = 3\n')
    assert main(["plan", "check", str(tmp_path / "plan.toml")]) == 2
    err = capsys.readouterr().err
    assert "[sanity]: unknown key(s) 'stpes' (did you mean 'steps'?)" in err and len(err.strip().splitlines()) == 1


def test_a_plan_and_every_table_in_it_are_frozen_and_hashable():
    """A plan is validated once, when it is read: a table changed afterwards would run settings
    nothing checked and that the resume fingerprint, taken from the plan, would not show."""
    raw = {
        "attacks": [{"name": "pgd", "eps": [0.1, 0.2]}],
        "corruptions": {"names": ["gaussian_noise"], "severities": [1]},
        "sequences": {"names": ["translate"]},
        "system_noise": {"decoders": ["pil"], "resizes": ["pil-bilinear"]},
        "metrics": {}, "sanity": {"enabled": True},
        "natural_shift": {"ood": ["folder:/nonexistent"]}}
    plan = plan_from_dict(raw)
    tables = [plan, *plan.runs, plan.corruptions, plan.sequences, plan.system_noise, plan.metrics,
              plan.sanity, plan.natural_shift]
    for table in tables:
        assert type(table).__dataclass_params__.frozen, type(table).__name__
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(table, dataclasses.fields(table)[0].name, None)
    assert hash(plan) == hash(plan_from_dict(raw))  # by value: equal plans are one cache key
