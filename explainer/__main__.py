"""`python -m explainer ...`: the command line (`cli.main`), also installed as the `explainer` command."""

import sys

from .cli import main

sys.exit(main())
