"""``python -m robustjax.cli``: the command line, as the ``robustjax`` script runs it."""

import sys

from robustjax.cli import main

sys.exit(main())
