"""`python -m chain ...`: see chain.cli."""

import sys

from chain.cli import main

sys.exit(main())
