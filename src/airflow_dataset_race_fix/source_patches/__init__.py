"""
Source patches: the fix as unified diffs against the installed Airflow files (docs/source-patches.md).

``patches/`` holds one series for every supported release, generated from the fixed members the shim
installs by the repository's ``tools/patchgen``, with each target file's sha256s per release in
``verified-releases``. Nothing here imports Airflow: it works on files, so that it can patch a
site-packages other than the running interpreter's. Each module's docstring says its part.
"""
