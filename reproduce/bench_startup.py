"""
Interpreter start-up cost of the shim: ``python -c pass`` with and without
``PYTHONPATH=<bootstrap dir>``, many runs interleaved, medians.

    python reproduce/bench_startup.py [--runs 60] [--python PATH] [--no-compile]

The shim's start-up modules are byte-compiled first (``pip install`` does that for an
installed package; a source checkout run with PYTHONDONTWRITEBYTECODE=1 would otherwise
compile them at every start and measure the compiler). ``--no-compile`` skips that.

Prints the medians in milliseconds (wall clock, and CPU time of the child, which a busy
machine disturbs less), the difference and the ratio. Not a timed test: the numbers
depend on the machine and its load; run it on a quiet one.
"""

from __future__ import annotations

import argparse
import os
import py_compile
import statistics
import subprocess
import sys
import time

from airflow_dataset_race_fix import BOOTSTRAP_DIR
from airflow_dataset_race_fix.bootstrap import SWITCHES

# What an interpreter start with the shim loads (and nothing else of ours).
STARTUP_MODULES = (
    "__init__.py",
    "bootstrap.py",
    "post_import.py",
    "_bootstrap/__init__.py",
    "_bootstrap/sitecustomize.py",
)


def _compile_startup_modules() -> None:
    package_dir = os.path.dirname(BOOTSTRAP_DIR)
    for name in STARTUP_MODULES:
        py_compile.compile(os.path.join(package_dir, name), doraise=True)


def _environment(with_shim: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and k not in SWITCHES}
    if with_shim:
        env["PYTHONPATH"] = BOOTSTRAP_DIR
    return env


def _once(python: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one ``python -c pass``."""
    start = time.perf_counter()
    child = subprocess.Popen([python, "-c", "pass"], env=env)
    _, status, usage = os.wait4(child.pid, 0)
    wall = (time.perf_counter() - start) * 1000
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{python} -c pass exited with {child.returncode}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=60, help="runs per variant (default 60)")
    parser.add_argument("--python", default=sys.executable, help="interpreter to start (default: this one)")
    parser.add_argument(
        "--no-compile", action="store_true", help="do not byte-compile the start-up modules first"
    )
    args = parser.parse_args()
    if not args.no_compile:
        _compile_startup_modules()

    variants = {"without shim": _environment(False), "with shim": _environment(True)}
    check = subprocess.run(
        [args.python, "-c", "import sys; print('airflow' in sys.modules, 'sitecustomize' in sys.modules)"],
        env=variants["with shim"],
        capture_output=True,
        text=True,
        check=True,
    )
    print(f"with shim: airflow imported, sitecustomize loaded = {check.stdout.strip()}")

    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for name, env in variants.items():  # warm the page cache and bytecode
        _once(args.python, env)
    for _ in range(args.runs):  # interleaved, so load changes hit both variants alike
        for name, env in variants.items():
            w, c = _once(args.python, env)
            wall[name].append(w)
            cpu[name].append(c)

    for label, timings in (("wall", wall), ("cpu", cpu)):
        medians = {name: statistics.median(values) for name, values in timings.items()}
        for name, values in timings.items():
            q = statistics.quantiles(values, n=4)
            print(
                f"{label:>4} {name:>13}: median {medians[name]:6.2f} ms"
                f"  (quartiles {q[0]:.2f} .. {q[2]:.2f}, {len(values)} runs)"
            )
        base, shim = medians["without shim"], medians["with shim"]
        print(f"{label:>4}      overhead: {shim - base:+.2f} ms, ratio {shim / base:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
