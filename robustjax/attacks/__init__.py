"""Adversarial attacks: frozen configs called as ``attack(classifier, x, y, *, key, target=None)``."""

from robustjax.attacks.apgd import APGD
from robustjax.attacks.base import Attack, AttackResult, get, make, names, register_attack
from robustjax.attacks.cw import CWL2
from robustjax.attacks.deepfool import DeepFool
from robustjax.attacks.fab import FAB
from robustjax.attacks.fgsm import FGSM
from robustjax.attacks.mifgsm import MIFGSM
from robustjax.attacks.pgd import PGD

__all__ = [
    "APGD", "CWL2", "FAB", "FGSM", "MIFGSM", "PGD", "Attack", "AttackResult", "DeepFool",
    "get", "make", "names", "register_attack",
]
