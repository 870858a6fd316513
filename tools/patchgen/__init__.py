"""
``python -m tools.patchgen``: regenerate ``patches/`` from the fix and verify the series
against every supported release's files (``generator``), read from the release wheels,
which pip downloads once into a cache (``wheels``). A development tool of the repository:
the wheel ships the patches, not this.
"""
