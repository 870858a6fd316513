"""
What the fix costs, stock and fixed side by side on one database:
``python reproduce/bench.py --backend postgres`` (or ``python -m reproduce.bench`` from the clone).

The bench itself is the package ``reproduce/benchmark`` (one module per case); this is its command line.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # a script: the clone on sys.path, not reproduce/ (its reproduce.py is no package)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from reproduce.benchmark.cli import main

if __name__ == "__main__":
    sys.exit(main())
