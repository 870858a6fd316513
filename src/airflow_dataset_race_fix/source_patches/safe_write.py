"""
Writing files in site-packages so that an interruption leaves each file whole.

Every file is written to a temporary file in its own directory, flushed and fsynced,
then renamed over the target (``os.replace`` is atomic on POSIX). Several files are
swapped with SIGINT/SIGTERM/SIGHUP held off, and the ones already swapped are put back
if a later one fails. Writability is probed first so that a read-only tree is refused
before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import py_compile
import signal
import tempfile
from pathlib import Path

TEMP_SUFFIX = ".adrf-tmp"


class NotWritable(OSError):
    def __init__(self, directory: Path, reason: str):
        super().__init__(f"cannot write to {directory} ({reason})")
        self.directory = directory
        self.reason = reason


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


def replace_all(writes: list[tuple[Path, bytes, bytes]]) -> None:
    """Write every ``(path, new, old)`` or none: temp files first, then quick renames.

    If a rename fails, the files already renamed get their old bytes back. A SIGKILL or a
    power cut between two renames can still leave some files new and some old, each whole:
    ``check`` then says "half applied" and ``revert`` puts everything back.
    """
    temps: list[tuple[Path, Path]] = []
    try:
        for path, new, _ in writes:
            temps.append((write_temp(path, new, path), path))
        done: list[tuple[Path, bytes, bytes]] = []
        with signals_held():
            try:
                for (temp, path), write in zip(temps, writes):
                    os.replace(temp, path)
                    done.append(write)
            except BaseException:
                for path, _, old in reversed(done):
                    atomic_write(path, old, path)
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
        return f"could not refresh the bytecode of {path} ({err}); Python recompiles it when the cache is stale"
    return None
