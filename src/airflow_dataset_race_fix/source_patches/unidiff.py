"""
A strict unified diff: parse, apply forward or in reverse, at an offset but with no fuzz.

One series serves every supported release, whose files differ away from the patched members,
so a hunk is found where GNU ``patch`` finds it (its header's line plus the previous hunk's
offset, else the nearest line after or before), but no line may differ: the caller refuses.
The header before the first ``--- `` line (DEP-3) is kept, not interpreted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """The patch text is malformed, or does not fit the file exactly."""


@dataclass
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: list[str] = field(default_factory=list)  # each with its ' ', '-' or '+' prefix

    def side(self, new: bool) -> list[str]:
        keep = "+" if new else "-"
        return [line[1:] for line in self.lines if line[0] in (" ", keep)]


@dataclass
class FilePatch:
    old_path: str
    new_path: str
    hunks: list[Hunk]

    @property
    def path(self) -> str:
        """Target path with the ``a/`` / ``b/`` prefix stripped (``patch -p1``)."""
        return self.new_path.split("/", 1)[1] if "/" in self.new_path else self.new_path


def parse(text: str) -> tuple[str, list[FilePatch]]:
    """Split ``text`` into its header and its file patches."""
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and not (
        lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
    ):
        i += 1
    header = "".join(lines[:i])
    files: list[FilePatch] = []
    while i < len(lines):
        if not lines[i].startswith("--- ") or i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(f"line {i + 1}: expected a '--- ' / '+++ ' file header, found {lines[i]!r}")
        old_path = lines[i][4:].rstrip("\n").split("\t")[0]
        new_path = lines[i + 1][4:].rstrip("\n").split("\t")[0]
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith("@@"):
            match = _HUNK.match(lines[i])
            if not match:
                raise PatchError(f"line {i + 1}: malformed hunk header {lines[i]!r}")
            a, alen, b, blen = match.groups()
            hunk = Hunk(int(a), int(alen or 1), int(b), int(blen or 1))
            i += 1
            old_seen = new_seen = 0
            while old_seen < hunk.old_len or new_seen < hunk.new_len:
                if i >= len(lines):
                    raise PatchError(f"hunk at line {hunk.old_start}: patch ends inside the hunk")
                line = lines[i]
                if line.startswith("\\"):
                    raise PatchError(f"line {i + 1}: 'No newline at end of file' is not supported")
                if line == "\n":  # some editors strip the space of an empty context line
                    line = " \n"
                if line[0] not in " -+":
                    raise PatchError(
                        f"line {i + 1}: unexpected {line!r} inside a hunk (line counts do not match)"
                    )
                old_seen += line[0] in " -"
                new_seen += line[0] in " +"
                hunk.lines.append(line)
                i += 1
            if old_seen != hunk.old_len or new_seen != hunk.new_len:
                raise PatchError(f"hunk at line {hunk.old_start}: line counts do not match its header")
            hunks.append(hunk)
        if not hunks:
            raise PatchError(f"{new_path}: no hunks")
        files.append(FilePatch(old_path, new_path, hunks))
    if not files:
        raise PatchError("no file patch found")
    return header, files


def apply(patch: FilePatch, text: str, reverse: bool = False) -> str:
    """Apply ``patch`` to ``text`` (or undo it); each hunk must match exactly, at an offset."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    pos = 0  # next unread line of ``lines``
    offset = 0  # where the previous hunk was found, against where its header put it
    for number, hunk in enumerate(patch.hunks, 1):
        stated = (hunk.new_start if reverse else hunk.old_start) - 1
        length = hunk.new_len if reverse else hunk.old_len
        if length == 0:  # pure insertion: the header names the line before it
            stated += 1
        expected = hunk.side(new=reverse)
        start = _locate(lines, expected, stated + offset, pos)
        if start is None:
            raise PatchError(
                f"{patch.path}: hunk {number} (line {stated + 1}) does not match the file"
                + (" (already reverted?)" if reverse else " (already applied, or another release?)")
            )
        offset = start - stated
        out.extend(lines[pos:start])
        out.extend(hunk.side(new=not reverse))
        pos = start + length
    out.extend(lines[pos:])
    return "".join(out)


def _locate(lines: list[str], expected: list[str], guess: int, first: int) -> int | None:
    """The line nearest ``guess`` (after before before, as GNU patch tries) at which
    ``expected`` is found, not before ``first``; None if it is nowhere."""
    if not expected:  # nothing to match: where the header says
        return guess if first <= guess <= len(lines) else None
    last = len(lines) - len(expected)
    for distance in range(max(guess - first, last - guess) + 1):
        for start in (guess + distance, guess - distance) if distance else (guess,):
            if first <= start <= last and lines[start : start + len(expected)] == expected:
                return start
    return None
