"""robustjax inside other people's JAX code: every sharding mode, traced hyperparameters,
the dtype policy, training-safe classifiers, the CLI with a user's module, the README's
adversarial-training step."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen, nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import robustjax as rj
from robustjax.evaluation import evaluate, plan_from_dict
from tests.helpers import random_linear_classifier

README = Path(__file__).resolve().parents[1] / "README.md"

# Every registered attack with a small budget: a new attack must be added here.
SMALL_ATTACKS = {
    "apgd": dict(eps=0.1, steps=3),
    "autoattack": dict(eps=0.1, steps=2, target_classes=2, square_queries=20, checks="off"),
    "boundary": dict(max_queries=60),
    "cw_l2": dict(steps=3, binary_search_steps=2),
    "deepfool": dict(steps=3),
    "fab": dict(eps=0.1, steps=3),
    "fgsm": dict(eps=0.1),
    "hop_skip_jump": dict(max_queries=60),
    "mifgsm": dict(eps=0.1, steps=3),
    "nes": dict(eps=0.1, max_queries=60, samples=4),
    "pgd": dict(eps=0.1, steps=3),
    "rays": dict(eps=0.1, max_queries=60),
    "sign_opt": dict(max_queries=80),
    "simba": dict(max_queries=60),
    "spsa": dict(eps=0.1, max_queries=60, samples=2),
    "square": dict(eps=0.1, max_queries=60),
}


def explicit_batch(*arrays):
    mesh = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Explicit,))
    return tuple(jax.device_put(a, NamedSharding(mesh, PartitionSpec("batch"))) for a in arrays)


def shard_mapped(fn, *batched, replicated=()):
    """``fn(*batched, *replicated)`` as a jitted ``shard_map`` body with the default checks."""
    mesh = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Auto,))
    specs = (PartitionSpec("batch"),) * len(batched) + (PartitionSpec(),) * len(replicated)
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=PartitionSpec("batch")))


def test_the_attack_table_lists_every_registered_attack():
    assert sorted(SMALL_ATTACKS) == sorted(rj.attacks.names())


@pytest.mark.parametrize("name", sorted(SMALL_ATTACKS))
def test_every_attack_traces_on_explicit_axes_and_in_shard_map(name, linear, batch, key):
    """The sharding-type and varying-axes checks fail at trace time: tracing each attack
    (no compile) covers every loop and branch of every attack."""
    attack = rj.attacks.create(name, **SMALL_ATTACKS[name])
    explicit = jax.eval_shape(lambda x, y: attack(linear, x, y, key=key), *explicit_batch(*batch))
    assert explicit.x_adv.sharding.spec[0] == "batch" and explicit.success.sharding.spec[0] == "batch"
    mapped = shard_mapped(lambda x, y, c, k: attack(c, x, y, key=k).x_adv, *batch, replicated=(linear, key))
    assert mapped.trace(*batch, linear, key).out_info.shape == batch[0].shape


@pytest.mark.parametrize("name", sorted(SMALL_ATTACKS))
def test_every_attack_traces_under_vmap_over_keys_and_sweeps_in_shard_map(name, linear, batch, key):
    """``vmap`` turns a ``cond`` into a select of both branches, whose varying-axes types
    ``shard_map`` checks; a sweep vmaps over epsilons and restart keys."""
    attack = rj.attacks.create(name, **SMALL_ATTACKS[name])

    def over_keys(x, y, c, k):
        return jax.vmap(lambda each: attack(c, x, y, key=each).x_adv)(jax.random.split(k, 2))[1]

    mapped = shard_mapped(over_keys, *batch, replicated=(linear, key))
    assert mapped.trace(*batch, linear, key).out_info.shape == batch[0].shape
    if "eps" in SMALL_ATTACKS[name]:
        swept = shard_mapped(lambda x, y, c, k: attack.sweep(c, x, y, key=k, eps=(0.05, 0.1), restarts=2).success[1],
                             *batch, replicated=(linear, key))
        assert swept.trace(*batch, linear, key).out_info.shape == batch[1].shape


@pytest.mark.parametrize("name", ["pgd", "square"])
def test_attacks_on_sharded_batches_equal_the_unsharded_run(name, linear, batch, key):
    attack = rj.attacks.create(name, **SMALL_ATTACKS[name])
    local = jax.jit(lambda x, y: attack(linear, x, y, key=key))(*batch)
    explicit = attack(linear, *explicit_batch(*batch), key=key)
    np.testing.assert_allclose(explicit.x_adv, local.x_adv, atol=1e-6)
    np.testing.assert_array_equal(explicit.queries, local.queries)
    mapped = shard_mapped(lambda x, y, c, k: attack(c, x, y, key=k).success, *batch, replicated=(linear, key))
    assert mapped(*batch, linear, key).shape == (8,)


def test_a_max_pool_network_is_attacked_on_an_explicit_mesh(digits_clf, digits_batch, key):
    x, y = (a[:8] for a in digits_batch)
    attack = rj.attacks.FGSM(eps=0.1)
    np.testing.assert_allclose(attack(digits_clf, *explicit_batch(x, y), key=key).x_adv,
                               attack(digits_clf, x, y, key=key).x_adv, atol=1e-6)


@pytest.mark.parametrize("name", ["shot_noise", "glass_blur", "jpeg_compression", "elastic_transform", "snow"])
def test_corruptions_trace_on_explicit_axes_and_in_shard_map(name, key):
    x = np.random.default_rng(1).uniform(0, 1, (8, 8, 8, 1)).astype(np.float32)
    explicit = jax.eval_shape(lambda x: rj.noise.create(name, 3, "cifar")(x, key), *explicit_batch(x))
    assert explicit.sharding.spec[0] == "batch"
    mapped = shard_mapped(rj.noise.create(name, 3, "cifar"), x, replicated=(key,))
    assert mapped.trace(x, key).out_info.shape == x.shape


def test_a_corruption_on_an_explicit_batch_equals_the_unsharded_one(key):
    x = np.random.default_rng(1).uniform(0, 1, (8, 8, 8, 1)).astype(np.float32)
    np.testing.assert_allclose(rj.noise.corrupt(*explicit_batch(x), "jpeg_compression", 3, key=key),
                               rj.noise.corrupt(x, "jpeg_compression", 3, key=key), atol=1e-6)


METRICS = {
    "accuracy": lambda logits, y, x, x_adv: rj.metrics.behaviour.accuracy(logits, y),
    "accumulator": lambda logits, y, x, x_adv: rj.metrics.behaviour.Accuracy.empty().update(logits, y).compute(),
    "lp_distortion": lambda logits, y, x, x_adv: rj.metrics.imperceptibility.lp_distortion(x, x_adv),
    "ssim": lambda logits, y, x, x_adv: rj.metrics.imperceptibility.structural_similarity(x, x_adv),
    "ece": lambda logits, y, x, x_adv: rj.metrics.calibration.expected_calibration_error(
        jax.nn.softmax(logits).max(-1), jnp.argmax(logits, -1) == y),
    "aurra": lambda logits, y, x, x_adv: rj.metrics.calibration.aurra(
        jax.nn.softmax(logits).max(-1), jnp.argmax(logits, -1) == y),
}


@pytest.fixture(scope="module")
def metric_inputs():
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 1, (8, 16, 16, 1)).astype(np.float32)
    x_adv = np.clip(x + rng.uniform(-0.05, 0.05, x.shape), 0, 1).astype(np.float32)
    return rng.normal(size=(8, 10)).astype(np.float32), rng.integers(0, 10, 8).astype(np.int32), x, x_adv


@pytest.mark.parametrize("name", sorted(METRICS))
def test_metrics_trace_on_an_explicitly_sharded_batch(name, metric_inputs):
    jax.eval_shape(METRICS[name], *explicit_batch(*metric_inputs))


def test_an_accumulator_streams_inside_shard_map_and_merges_with_psum(metric_inputs):
    logits, y, _, _ = metric_inputs

    def local(logits, y):
        accumulator = rj.metrics.behaviour.Accuracy.empty().update(logits, y)
        return jax.tree.map(lambda leaf: jax.lax.psum(leaf, "batch"), accumulator)

    mesh = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Auto,))
    merged = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=PartitionSpec("batch"), out_specs=PartitionSpec()))(
        logits, y)
    np.testing.assert_allclose(merged.compute()["accuracy"], rj.metrics.behaviour.accuracy(logits, y))


def test_image_metrics_compute_in_float32_whatever_the_dtype(metric_inputs):
    _, _, x, x_adv = metric_inputs
    low = [np.asarray(jnp.asarray(a, jnp.bfloat16)) for a in (x, x_adv)]
    as_float32 = [np.asarray(a, np.float32) for a in low]
    for metric in (rj.metrics.imperceptibility.structural_similarity,
                   rj.metrics.imperceptibility.perturbation_sensitivity_distance):
        np.testing.assert_array_equal(metric(*low), metric(*as_float32))
    assert rj.metrics.imperceptibility.lp_distortion(*low).l2.dtype == jnp.float32


def test_a_population_evaluates_the_same_under_a_callers_explicit_mesh():
    from robustjax.evaluation.plan import plan_from_dict
    from robustjax.evaluation.population import evaluate_population

    plan = plan_from_dict({"batch_size": 16, "num_examples": 16, "attacks": [{"name": "fgsm", "eps": 0.1}],
                           "sanity": {"enabled": False}})
    supernet = rj.nas.bundled_supernet("nb201_digits")
    archs = [supernet.space.config(i) for i in (3, 700)]
    digits = rj.data.load("digits", split="test")
    alone = evaluate_population(supernet, archs, digits, plan, population_size=2, network_shards=2)
    with jax.set_mesh(jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Explicit,))):
        inside = evaluate_population(supernet, archs, digits, plan, population_size=2, network_shards=2)
    assert [r["attacks"] for r in inside] == [r["attacks"] for r in alone]


@pytest.mark.parametrize("cls", [rj.attacks.PGD, rj.attacks.MIFGSM, rj.attacks.FGSM, rj.attacks.APGD])
def test_a_traced_eps_compiles_once_and_gives_the_python_float_result(cls, linear, batch, key):
    x, y = batch
    budget = {} if cls is rj.attacks.FGSM else {"steps": 2}
    traces = []

    @jax.jit
    def attack(eps):
        traces.append(eps)
        return cls(eps=eps, **budget)(linear, x, y, key=key).x_adv

    results = [attack(jnp.float32(eps)) for eps in (0.02, 0.3, 0.05)]
    assert len(traces) == 1
    as_float = cls(eps=0.05, **budget)(linear, x, y, key=key).x_adv
    np.testing.assert_allclose(results[-1], as_float, atol=1e-6)
    assert not np.allclose(results[0], results[1])
    if cls is rj.attacks.PGD:  # outside jit, a concrete JAX scalar (the compacted run)
        np.testing.assert_allclose(cls(eps=jnp.float32(0.05), **budget)(linear, x, y, key=key).x_adv, as_float,
                                   atol=1e-6)


def test_traced_step_size_and_the_checks_of_jax_scalars(linear, batch, key):
    x, y = batch
    run = jax.jit(lambda a: rj.attacks.PGD(eps=0.1, steps=2, step_size=a)(linear, x, y, key=key).x_adv)
    as_float = jax.jit(lambda: rj.attacks.PGD(eps=0.1, steps=2, step_size=0.01)(linear, x, y, key=key).x_adv)
    np.testing.assert_allclose(run(jnp.float32(0.01)), as_float(), atol=1e-6)
    with pytest.raises(ValueError, match="eps must be finite and >= 0"):
        rj.attacks.PGD(eps=jnp.float32(-0.1))
    with pytest.raises(TypeError, match="eps must be a scalar"):
        rj.attacks.PGD(eps=jnp.ones(2))
    with pytest.raises(TypeError, match="p_init must be a Python number"):  # it shapes Square's schedule
        rj.attacks.Square(p_init=jnp.float32(0.5))
    with pytest.raises(ValueError, match="steps must be an integer"):
        rj.attacks.PGD(steps=jnp.int32(3))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, np.float64])
def test_images_of_any_float_dtype_are_computed_in_float32(dtype, linear, batch, key):
    x, y = batch
    x_low = np.asarray(jnp.asarray(x, dtype)) if dtype is not np.float64 else x.astype(np.float64)
    as_float32 = jnp.asarray(x_low, jnp.float32)
    attack = rj.attacks.FGSM(eps=0.1)
    result = attack(linear, x_low, y, key=key)
    assert result.x_adv.dtype == jnp.float32
    np.testing.assert_array_equal(result.x_adv, attack(linear, as_float32, y, key=key).x_adv)
    assert rj.noise.corrupt(x_low, "gaussian_noise", 2, key=key).dtype == jnp.float32


def test_a_float64_model_under_x64_is_refused_with_the_fix_and_a_float32_one_runs(linear, batch, key):
    """Square's and AutoAttack's loops carry float32 margins: a float64 model (x64 on) is
    refused before tracing, by every attack and by evaluate, naming the cast."""
    x, y = batch
    attacks = [rj.attacks.FGSM(eps=0.1), rj.attacks.Square(eps=0.1, max_queries=4)]
    with jax.enable_x64(True):
        wide = linear.replace(params=jax.tree.map(lambda p: jnp.asarray(p, jnp.float64), linear.params))
        assert jax.tree.leaves(wide.params)[0].dtype == jnp.float64
        for attack in attacks:
            with pytest.raises(TypeError, match=r"model .* has float64 parameters; .* cast the model first"):
                attack(wide, x, y, key=key)
            assert attack(linear, x, y, key=key).x_adv.dtype == jnp.float32
        dataset = rj.data.from_arrays(x, y, num_classes=linear.num_classes)
        plan = plan_from_dict({"batch_size": 4, "attacks": [{"name": "fgsm", "eps": 0.1}]})
        with pytest.raises(TypeError, match="float64 parameters"):
            evaluate(wide, dataset, plan)


def test_integer_images_are_refused_with_the_fix(linear, batch, key):
    x, y = batch
    with pytest.raises(TypeError, match="divide uint8 images by 255"):
        rj.attacks.FGSM()(linear, (x * 255).astype(np.uint8), y, key=key)


class BatchNormNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(16, 3, rngs=rngs)
        self.norm = nnx.BatchNorm(3, rngs=rngs)

    def __call__(self, x):
        return self.norm(self.linear(x.reshape(x.shape[0], -1)))


def test_from_nnx_leaves_the_module_alone_and_offers_batch_statistics(batch):
    x, _ = batch
    module = BatchNormNet(nnx.Rngs(0))
    module.norm.mean[...] = jnp.full(3, 0.5)  # running averages unlike any batch's
    evaluation = rj.Classifier.from_nnx(module, num_classes=3, input_shape=(4, 4, 1))
    training = rj.Classifier.from_nnx(module, num_classes=3, input_shape=(4, 4, 1), batch_statistics=True)
    assert module.norm.use_running_average is False  # still in training mode
    h = module.linear(jnp.asarray(x).reshape(8, -1))
    normalised = (h - h.mean(0)) / jnp.sqrt(h.var(0) + module.norm.epsilon)
    np.testing.assert_allclose(training(jnp.asarray(x)), normalised, atol=1e-5)
    assert not np.allclose(evaluation(jnp.asarray(x)), training(jnp.asarray(x)), atol=1e-2)
    before = np.asarray(module.norm.mean[...])
    rj.attacks.FGSM(eps=0.1)(training, x, np.zeros(8, np.int32), key=jax.random.key(0))
    np.testing.assert_array_equal(module.norm.mean[...], before)  # attacks never update running averages


class LinenNet(linen.Module):
    @linen.compact
    def __call__(self, x, train: bool = True):
        h = linen.relu(linen.BatchNorm(use_running_average=not train)(linen.Conv(3, (3, 3))(x)))
        return linen.Dense(3)(h.reshape(h.shape[0], -1))


def test_from_linen_applies_the_module_in_the_mode_given_and_shares_programs_between_wraps(batch, key):
    x, y = batch
    module = LinenNet()
    variables = module.init(jax.random.key(1), jnp.asarray(x), train=False)
    variables = {**variables, "batch_stats": jax.tree.map(lambda v: v + 0.5, variables["batch_stats"])}
    clf = rj.Classifier.from_linen(module, variables, num_classes=3, input_shape=(4, 4, 1), train=False)
    np.testing.assert_array_equal(clf(x), module.apply(variables, jnp.asarray(x), train=False))
    assert not np.allclose(clf(x), module.apply(variables, jnp.asarray(x), train=True, mutable=["batch_stats"])[0])
    features = clf.features(x)
    assert set(features) == {"Conv_0", "BatchNorm_0", "Dense_0", "logits"}
    np.testing.assert_array_equal(features["Dense_0"], features["logits"])
    traces = []

    @jax.jit
    def attack(classifier):
        traces.append(1)
        return rj.attacks.FGSM(eps=0.1)(classifier, x, y, key=key).x_adv

    again = rj.Classifier.from_linen(LinenNet(), variables, num_classes=3, input_shape=(4, 4, 1), train=False)
    np.testing.assert_array_equal(attack(clf), attack(again))
    assert len(traces) == 1  # an equal module wrapped anew reuses the program
    with pytest.raises(TypeError, match="module must be a Flax Linen module .* wrap an NNX module with "
                                        "Classifier.from_nnx"):
        rj.Classifier.from_linen(BatchNormNet(nnx.Rngs(0)), variables, num_classes=3, input_shape=(4, 4, 1))
    with pytest.raises(TypeError, match="keyword arguments passed to module.apply must be hashable"):
        rj.Classifier.from_linen(module, variables, num_classes=3, input_shape=(4, 4, 1), mutable=["batch_stats"])


def test_classifiers_with_different_names_stack_for_vmap(linear, batch, key):
    x, y = batch
    other = random_linear_classifier(seed=4, num_classes=3, input_shape=(4, 4, 1)).replace(name="other")
    stacked = rj.Classifier.stack([linear, other])
    assert stacked.name == "2 classifiers"
    logits = jax.vmap(lambda c: c(jnp.asarray(x)))(stacked)
    np.testing.assert_allclose(logits[1], other(jnp.asarray(x)), atol=1e-6)
    with pytest.raises(ValueError, match="their num_classes differ"):
        rj.Classifier.stack([linear, random_linear_classifier(seed=4, num_classes=4, input_shape=(4, 4, 1))])


def test_papercuts(linear, batch):
    x, y = batch
    clf = rj.Classifier(params=linear.params, apply_fn=linear.apply_fn, num_classes=np.int64(3),
                        input_shape=(np.int64(4), 4, 1))
    assert clf.num_classes == 3 and type(clf.num_classes) is int
    with pytest.raises(TypeError, match=r"attack 'pgd' needs a PRNG key: call it with key=jax\.random\.key"):
        rj.attacks.PGD()(linear, x, y)
    result = rj.attacks.transfer(rj.attacks.FGSM(eps=0.1), linear, linear, x, y, key=jax.random.key(0))
    np.testing.assert_array_equal(result.success, result.surrogate_success)
    with pytest.raises(TypeError, match="victim must be a robustjax.Classifier"):
        rj.attacks.transfer(rj.attacks.FGSM(), linear, "model", x, y, key=jax.random.key(0))


def readme_block(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return next(block for block in blocks if marker in block)


def test_the_readme_adversarial_training_step_runs_with_one_compile():
    namespace: dict = {}
    exec(readme_block("def adversarial_step"), namespace)
    assert namespace["adversarial_step"]._cache_size() == 1  # five epsilons, one program
    params, x, y = namespace["params"], namespace["x"], namespace["y"]
    clf = rj.Classifier(params=params, apply_fn=namespace["apply_fn"], num_classes=10, input_shape=(8, 8, 1))
    assert float((jnp.argmax(clf(jnp.asarray(x)), -1) == y).mean()) > 0.5  # it learnt


def test_the_installed_command_finds_a_module_in_the_working_folder(tmp_path):
    command = shutil.which("robustjax", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                                os.environ.get("PATH", "")]))
    assert command, "the robustjax console script is not installed"
    (tmp_path / "mymodels.py").write_text(textwrap.dedent("""
        import robustjax as rj

        def my_model():
            return rj.zoo.load("digits_mlp")
    """))
    (tmp_path / "plan.toml").write_text('num_examples = 16\nbatch_size = 16\n[[attacks]]\nname = "fgsm"\neps = 0.1\n'
                                        '[sanity]\nenabled = false\n')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([command, "evaluate", "--model", "mymodels:my_model", "--plan", "plan.toml",
                           "--out", "report"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "report" / "report.json").exists()
