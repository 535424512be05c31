"""`python -m substrate serve ...`: the same command as `conductor substrate serve`."""

import sys

from substrate.cli import main

sys.exit(main())
