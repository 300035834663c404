"""`python -m raysent.cli`: the `raysent` command."""

import sys

from raysent.cli import main

sys.exit(main())
