"""`python benchmarks/run.py`: the benchmark from a checkout (the code is `chain.bench`)."""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chain.bench.run import main

if __name__ == "__main__":
    sys.exit(main())
