"""
Writing files in site-packages so that an interruption leaves each file whole: a fsynced
temporary file in the same directory, then ``os.replace``; several files with signals held
off, put back if a later one fails (:func:`replace_all`); :func:`locked` makes commands take turns.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import py_compile
import signal
import tempfile
from pathlib import Path

TEMP_SUFFIX = ".adrf-tmp"

# Tests stop or kill the process at the Nth step point (``stop:N``, ``kill:N``) to see
# what an interruption there leaves behind.
TEST_STEP_ENV = "ADRF_TEST_STEP"
_steps_passed = 0


def step_point() -> None:
    """A point between two writes (a no-op unless ``$ADRF_TEST_STEP`` names it)."""
    global _steps_passed
    _steps_passed += 1
    action, _, number = os.environ.get(TEST_STEP_ENV, "").partition(":")
    if number == str(_steps_passed) and action in ("kill", "stop"):
        os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGSTOP)


@contextlib.contextmanager
def locked(directory: Path, shared: bool = False, on_wait=None):
    """Hold an flock on ``directory`` itself (no lock file to leave behind); ``on_wait()`` before waiting."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # releases the lock


class NotWritable(OSError):
    def __init__(self, directory: Path, reason: str):
        super().__init__(f"cannot write to {directory} ({reason})")


@contextlib.contextmanager
def signals_held():
    """Hold off SIGINT/SIGTERM/SIGHUP while files are swapped; they are delivered after."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def write_temp(target: Path, data: bytes, mode_from: Path | None) -> Path:
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if mode_from is not None and mode_from.exists():
            os.chmod(name, mode_from.stat().st_mode & 0o7777)
        else:
            os.chmod(name, 0o644)
    except BaseException:
        os.unlink(name)
        raise
    return Path(name)


def atomic_write(path: Path, data: bytes, mode_from: Path | None = None) -> None:
    """One file, whole or not at all."""
    temp = write_temp(path, data, mode_from)
    try:
        os.replace(temp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()


def fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def check_writable(directories: list[Path]) -> None:
    """Refuse before writing anything if a directory cannot take a new file (and a rename)."""
    for directory in dict.fromkeys(directories):
        probe = directory
        while not probe.exists():  # the backup directory may not exist yet
            probe = probe.parent
        try:
            fd, name = tempfile.mkstemp(dir=probe, prefix=".adrf-probe-", suffix=TEMP_SUFFIX)
            os.close(fd)
            os.unlink(name)
        except OSError as err:
            raise NotWritable(probe, err.strerror or str(err)) from err


def cleanup_stale_temps(directories: list[Path]) -> None:
    """Temporary files of an earlier run killed with SIGKILL (never the targets themselves)."""
    for directory in dict.fromkeys(directories):
        if directory.is_dir():
            for stale in directory.glob(f".*{TEMP_SUFFIX}"):
                with contextlib.suppress(OSError):
                    stale.unlink()


def replace_all(writes: list[tuple[Path, bytes, bytes | None]]) -> None:
    """Write every ``(path, new, old)`` (``old`` None: the file is missing) or none.

    Two renames are never one atomic step, so with several files the last one is removed
    first and renamed into place last: while the files disagree it is absent, and no process
    imports a mix of old and new, even after a SIGKILL (the next apply or revert finishes).
    """
    temps: list[tuple[Path, Path]] = []
    try:
        for path, new, _ in writes:
            temps.append((write_temp(path, new, path if path.exists() else None), path))
        done: list[tuple[Path, bytes, bytes | None]] = []
        with signals_held():
            try:
                last_path, _, last_old = writes[-1]
                if len(writes) > 1 and last_old is not None:
                    last_path.unlink()
                    done.append(writes[-1])
                    fsync_dir(last_path.parent)
                    step_point()
                for (temp, path), write in zip(temps, writes):
                    os.replace(temp, path)
                    if write is not writes[-1]:
                        done.append(write)
                    step_point()
            except BaseException:
                for path, _, old in reversed(done):
                    if old is None:
                        path.unlink(missing_ok=True)
                    else:
                        atomic_write(path, old, path if path.exists() else None)
                raise
        for directory in dict.fromkeys(path.parent for path, _, _ in writes):
            fsync_dir(directory)
    finally:
        for temp, _ in temps:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()


def refresh_bytecode(path: Path) -> str | None:
    """Drop every cached bytecode of ``path`` and compile it again; returns a warning or None."""
    pycache = path.parent / "__pycache__"
    try:
        for stale in pycache.glob(f"{path.stem}.*.pyc"):
            stale.unlink()
        py_compile.compile(str(path), doraise=True)
    except (OSError, py_compile.PyCompileError) as err:
        return (
            f"could not refresh the bytecode of {path} ({err}); Python recompiles it when the cache is stale"
        )
    return None
