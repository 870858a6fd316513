"""
``python -m reproduce`` from the clone's root (``reproduce/run`` runs it): show every race on
stock Airflow and show it gone with the fix. The options are ``runner.add_arguments``'s.
Exit codes: 0 as expected, 1 not as expected, 2 bad usage (one line), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

from reproduce import runner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="reproduce",
        description="Run the race scenarios (default), a stress run (--stress) or a real scheduler (--e2e) "
        "against stock Airflow and against the fix, each in its own interpreter and scratch database.",
    )
    runner.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return runner.main(args)
    except runner.ReproduceError as err:
        print(f"reproduce: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
