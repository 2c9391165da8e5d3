"""``python -m robustjax.cli``: the command line, as the ``robustjax`` script runs it."""

from robustjax.cli import script

script()
