"""``reproduce``: not implemented yet."""

from __future__ import annotations


def register(subparsers) -> None:
    pass
