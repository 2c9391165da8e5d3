"""Neural architecture search spaces, the networks built from their configs, weight-sharing
supernets, batch-norm recalibration and supernet training.

    space = rj.nas.space("nb201")           # or "bignas_resnet_basic", ...; rj.nas.names()
    space.config(11472).arch_string         # NAS-Bench-201's own ids and strings
    supernet = rj.nas.Supernet.load(folder) # or train_supernet(space, images, labels, out)
    supernet = rj.nas.bundled_supernet("nb201_digits")  # trained on the digits, bundled
    clf = supernet.subnet(11472, calibration=train_images)
    population = rj.nas.from_networks(space, archs, rj.nas.load_folder(space, folder, archs))  # trained cells
    nets = [rj.nas.trainable.trainable(space, a, key=k) for a, k in ...]  # cells to train as one population
"""

from robustjax.nas import models as _models  # noqa: F401  (registers nas.* in the zoo)
from robustjax.nas import nb201_packed, population, standalone, trainable
from robustjax.nas.bignas import NAMED_SUBNETS, BigNASConfig, BigNASSpace
from robustjax.nas.build import build_network, build_supernet, choice
from robustjax.nas.models import bundled_supernet
from robustjax.nas.nb201 import NB201Config, NB201Space
from robustjax.nas.population import Population
from robustjax.nas.recalibrate import calibration_subset, recalibrate
from robustjax.nas.space import (
    Cost,
    SearchSpace,
    create,
    get,
    names,
    register_space,
    space,
    space_doc,
)
from robustjax.nas.standalone import from_networks, load_folder
from robustjax.nas.supernet import Supernet
from robustjax.nas.train import TrainSettings, train_supernet

__all__ = ["BigNASConfig", "BigNASSpace", "Cost", "NAMED_SUBNETS", "NB201Config", "NB201Space", "Population",
           "SearchSpace", "Supernet", "TrainSettings", "build_network", "build_supernet", "bundled_supernet",
           "calibration_subset", "choice", "create", "from_networks", "get", "load_folder", "names", "nb201_packed",
           "population", "recalibrate", "register_space", "space", "space_doc", "standalone", "train_supernet",
           "trainable"]
