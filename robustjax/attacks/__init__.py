"""Adversarial attacks: frozen configs called as ``attack(classifier, x, y, *, key, target=None)``."""

from robustjax.attacks.base import Attack, AttackResult, get, make, names, register_attack
from robustjax.attacks.cw import CWL2
from robustjax.attacks.deepfool import DeepFool
from robustjax.attacks.fgsm import FGSM
from robustjax.attacks.mifgsm import MIFGSM
from robustjax.attacks.pgd import PGD

__all__ = ["CWL2", "DeepFool", "FGSM", "MIFGSM", "PGD", "Attack", "AttackResult", "get", "make", "names", "register_attack"]
