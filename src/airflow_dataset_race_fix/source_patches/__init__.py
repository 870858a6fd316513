"""
Source patches: the fix as unified diffs against the installed Airflow files (docs/source-patches.md).
Nothing here imports Airflow: it works on files, so it can patch another interpreter's site-packages.
"""
