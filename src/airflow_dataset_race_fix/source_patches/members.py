"""
Find a class member's source lines in a module's text, without importing it.

A member's lines are the ones ``inspect.getsource`` returns for it (first decorator to
the end of the block), so that what the patches splice is exactly what
``targets.fingerprint`` and the shim's "source-patched" check compare.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import inspect
import textwrap
from pathlib import Path

from airflow_dataset_race_fix.targets import Member


class MemberNotFound(LookupError):
    pass


def member_spans(lines: list[str], owner: str) -> dict[str, tuple[int, int]]:
    """``name -> (start, end)``: 0-based line slices of the methods (and nested classes) of ``owner``."""
    text = tuple(lines)
    return {name: _member_span(text, owner, name) for name in member_starts(lines, owner)}


def member_starts(lines: list[str], owner: str) -> dict[str, int]:
    """``name -> start``: the 0-based first line (first decorator) of each member of ``owner``."""
    return dict(_member_starts(tuple(lines), owner))


# Cached: a file's members are looked up one by one (47 of them in the scheduler's module).
@functools.lru_cache(maxsize=16)
def _member_starts(lines: tuple[str, ...], owner: str) -> tuple[tuple[str, int], ...]:
    tree = ast.parse("".join(lines))
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == owner]
    if len(classes) != 1:
        raise MemberNotFound(f"expected one top-level class {owner}, found {len(classes)}")
    starts: dict[str, int] = {}
    for node in classes[0].body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if node.name in starts:
            raise MemberNotFound(f"{owner}.{node.name} is defined more than once")
        starts[node.name] = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
    return tuple(starts.items())


# One member's end alone: the shim judges 2 members of a 2 000-line file in every process, and
# tokenizing every other member's block was most of its start-up cost.
@functools.lru_cache(maxsize=128)
def _member_span(lines: tuple[str, ...], owner: str, name: str) -> tuple[int, int] | None:
    start = dict(_member_starts(lines, owner)).get(name)
    if start is None:
        return None
    # inspect's block finder, as inspect.getsource uses it: same end as the fingerprint sees.
    return start, start + len(inspect.getblock(lines[start:]))


def member_span(lines: list[str], owner: str, name: str) -> tuple[int, int] | None:
    """``(start, end)`` 0-based line slice of ``owner.name`` in ``lines``; None if the class lacks it."""
    return _member_span(tuple(lines), owner, name)


def member_lines(lines: list[str], owner: str, name: str) -> list[str]:
    span = member_span(lines, owner, name)
    if span is None:
        raise MemberNotFound(f"{owner}.{name} not found")
    return lines[span[0] : span[1]]


def dedented_sha256(lines: list[str]) -> str:
    """``targets.fingerprint`` of a member, from its source lines."""
    return hashlib.sha256(textwrap.dedent("".join(lines)).encode()).hexdigest()


def fix_module_path(member: Member) -> Path:
    """The file of ``member``'s fix module (found, not imported: it imports Airflow)."""
    spec = importlib.util.find_spec(member.fix_module)
    if spec is None or spec.origin is None:
        raise MemberNotFound(f"fix module {member.fix_module} not found")
    return Path(spec.origin)


def fixed_member_lines(member: Member) -> list[str]:
    return list(_fixed_member_lines(member, fix_module_path(member).read_text(encoding="utf-8")))


@functools.lru_cache(maxsize=32)
def _fixed_member_lines(member: Member, text: str) -> tuple[str, ...]:
    return tuple(member_lines(text.splitlines(keepends=True), member.owner, member.name))
