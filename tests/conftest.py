"""Test setup: 8 simulated CPU devices and faster compiling (before jax is imported), shared
fixtures."""

import gc
import os

# The CLI's persistent compilation cache is process-wide JAX configuration: keep it off in
# the test process (the quick-start test turns it on in its own process).
os.environ["ROBUSTJAX_COMPILE_CACHE"] = "off"
# Without LLVM's expensive passes XLA's CPU backend compiles faster, and compiling is most of
# the suite's time: tests/test_training_population.py and test_notice_schedules.py took 234 s
# instead of 261 s, with the same results to the tests' tolerances, and the certify
# benchmark's quick run (mostly arithmetic) 55 s against 50 s. --xla_backend_optimization_level=0
# was tried and dropped: that run went past its 300 s limit and population weights moved by
# 3e-5. Subprocesses that run robustjax as a user does (the quick start, the sweep workers)
# drop these flags.
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8",
     "--xla_llvm_disable_expensive_passes=true"]
).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

import robustjax as rj  # noqa: E402
from tests.helpers import predicted_batch, random_linear_classifier  # noqa: E402

# Property-based tests run the same cases on every run (no random seed, no example
# database); each test sets its own max_examples.
settings.register_profile("robustjax", derandomize=True, deadline=None, database=None, max_examples=20,
                          print_blob=True)
settings.load_profile("robustjax")


@pytest.fixture(scope="session")
def digits_clf() -> rj.Classifier:
    return rj.zoo.create("digits_cnn")


@pytest.fixture(scope="session")
def digits_batch() -> tuple[np.ndarray, np.ndarray]:
    return rj.data.digits("test").arrays(limit=32)


@pytest.fixture(scope="session")
def linear() -> rj.Classifier:
    """A random 3-class linear classifier of 4x4 grey images: the smallest attack target."""
    return random_linear_classifier(seed=3, num_classes=3, input_shape=(4, 4, 1))


@pytest.fixture(scope="session")
def batch(linear) -> tuple[np.ndarray, np.ndarray]:
    """8 images that ``linear`` classifies as labelled."""
    return predicted_batch(linear, 8)


@pytest.fixture
def key() -> jax.Array:
    return jax.random.key(0)


@pytest.fixture(autouse=True)
def seeded_torch():
    """PyTorch models in the tests are initialised from torch's global generator: seed it per
    test, so that a test's twin does not depend on which tests ran before it."""
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="module")
def fresh_compilation_caches():
    """Drops every compiled program after each test module: the whole suite in one process
    otherwise keeps thousands of CPU executables (the large zoo models' among them) and ran
    out of memory near its end on a 24 GiB machine."""
    yield
    jax.clear_caches()
    gc.collect()
