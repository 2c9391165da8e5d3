"""Adversarial attacks: frozen configs called as ``attack(classifier, x, y, *, key, target=None)``."""

from robustjax.attacks.apgd import APGD
from robustjax.attacks.autoattack import AutoAttack
from robustjax.attacks.base import Attack, AttackResult, create, get, names, register_attack
from robustjax.attacks.boundary import Boundary
from robustjax.attacks.cw import CWL2
from robustjax.attacks.deepfool import DeepFool
from robustjax.attacks.fab import FAB
from robustjax.attacks.fgsm import FGSM
from robustjax.attacks.hsja import HopSkipJump
from robustjax.attacks.mifgsm import MIFGSM
from robustjax.attacks.nes import NES
from robustjax.attacks.pgd import PGD
from robustjax.attacks.rays import RayS
from robustjax.attacks.signopt import SignOPT
from robustjax.attacks.simba import SimBA
from robustjax.attacks.spsa import SPSA
from robustjax.attacks.square import Square
from robustjax.attacks.transfer import transfer

__all__ = [
    "APGD", "CWL2", "FAB", "FGSM", "MIFGSM", "NES", "PGD", "SPSA", "Attack", "AttackResult", "AutoAttack",
    "Boundary", "DeepFool", "HopSkipJump", "RayS", "SignOPT", "SimBA", "Square", "create", "get", "names",
    "register_attack", "transfer",
]
