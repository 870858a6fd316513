"""
python -m tests.explorer [explore|replay] ...  (from the repository root)

  explore --backend postgres --budget 300 --seed 7 [--program busy-row] [--stop-at-first]
  replay  --backend postgres --dags 'd=a' 'Q1:a S.loop Q2:a P1.reg:a P1.stamp ...'
  replay  --backend postgres --dags 'x=k&m' --lookback 5 '... S.fail:12 S.restart D.unmark D.off:x D.on:x ...'

Creates its own scratch database (as the tests do), runs, prints the report, drops it.
Exit status 1 when the fix does worse than stock somewhere.
"""

from __future__ import annotations

import argparse
import sys
import tempfile


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.explorer")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("explore")
    ex.add_argument("--backend", default="sqlite", choices=("sqlite", "postgres", "mysql"))
    ex.add_argument("--budget", type=int, default=None, help="interleavings per program (default: CI's)")
    ex.add_argument("--seed", type=int, default=None)
    ex.add_argument("--program", action="append", help="only these programs (repeatable)")
    ex.add_argument(
        "--stop-at-first", action="store_true", help="stop at the first interleaving where the fix does worse"
    )
    ex.add_argument("--no-minimize", action="store_true")
    rp = sub.add_parser("replay")
    rp.add_argument("--backend", default="sqlite", choices=("sqlite", "postgres", "mysql"))
    rp.add_argument(
        "--dags", default="d=a", help="DAGs: name=schedule[/max_active_runs], comma-separated (a, a|b, a&b/1)"
    )
    rp.add_argument("--per-loop", type=int, default=None, help="max_dagruns_to_create_per_loop")
    rp.add_argument("--tick", type=float, default=0.01, help="seconds from one step to the next")
    rp.add_argument("--lookback", type=int, default=None, help="event_lookback_seconds")
    rp.add_argument("steps")
    args = parser.parse_args(argv)

    from reproduce.harness.database import ScratchDatabase, configure_airflow_env

    database = ScratchDatabase(args.backend)
    database.create()
    home = tempfile.TemporaryDirectory(prefix="adrf-explorer-home-")
    try:
        configure_airflow_env(database.url, home.name)
        from reproduce.harness.database import init_airflow_db

        from .runner import apply_settings

        apply_settings()
        init_airflow_db()
        from . import explore as xp

        if args.command == "replay":
            dags = tuple(tuple(d.split("=", 1)) for d in args.dags.split(","))
            from .model import tokens

            steps = tokens(args.steps)
            stock, fixed = xp.run_pair(dags, steps, args.per_loop, args.tick, args.lookback)
            worse, both = xp.compare(stock, fixed)
            print(f"steps:  {' '.join(steps)}")
            print(f"stock:  {stock.summary()}   executed: {' '.join(stock.executed)}")
            print(f"fixed:  {fixed.summary()}   executed: {' '.join(fixed.executed)}")
            print(f"stock trace:  {' '.join(stock.trace)}")
            print(f"fixed trace:  {' '.join(fixed.trace)}")
            if stock.notes or fixed.notes:
                print(f"notes:  stock {stock.notes}; fixed {fixed.notes}")
            print(f"the fix does worse: {worse or 'no'}; both fail: {both or 'no'}")
            return 1 if worse else 0
        budget = args.budget if args.budget is not None else xp.default_budget(args.backend)
        seed = args.seed if args.seed is not None else xp.default_seed()
        result = xp.explore(
            args.backend,
            budget,
            seed,
            only=args.program,
            minimize_first=not args.no_minimize,
            stop_at_first=args.stop_at_first,
        )
        print(result.report())
        return 1 if result.worse else 0
    finally:
        from airflow import settings

        settings.dispose_orm()
        database.drop()
        home.cleanup()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
