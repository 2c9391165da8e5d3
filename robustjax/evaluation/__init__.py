"""Evaluation plans and the runner that turns a plan into a report."""

from robustjax.evaluation.plan import AttackRun, Plan, default_plan, load_plan, plan_from_dict
from robustjax.evaluation.runner import evaluate
from robustjax.output_folder import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "AttackRun", "Plan", "default_plan", "evaluate", "load_plan", "plan_from_dict"]
