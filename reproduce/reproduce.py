#!/usr/bin/env python
"""``python -m reproduce`` from any directory: ``python reproduce/reproduce.py [--backend ...] [--e2e]``."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # a script: the clone on sys.path, not reproduce/ (its reproduce.py is no package)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from reproduce.__main__ import main  # noqa: E402  this clone's lab, whatever install the package comes from

if __name__ == "__main__":
    sys.exit(main())
