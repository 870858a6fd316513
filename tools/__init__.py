"""Development tools of the repository (run from a clone; not part of the wheel)."""
