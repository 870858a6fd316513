"""
Source patches: the fix as unified diffs against the installed Airflow files.

``patches/`` holds one series for every supported release, generated from the same fixed
members that the shim installs (``airflow_dataset_race_fix.fix``) by the repository's
development tool ``tools/patchgen``, with ``verified-releases``: each target file's
sha256 before and after the series, per release. The ``applier`` applies or reverts it
with the checks an image build needs: the installed Airflow version, the wheel's RECORD
hash of every target file, the recorded sha256s, a dry run, temporary files and atomic
replace, backups and fresh bytecode. Nothing in this package imports Airflow: it works
on files, so that it can patch a site-packages directory other than the running
interpreter's.

Modules: ``members`` (find a class member's source lines), ``unidiff`` (strict unified
diff parser and applier), ``record`` (an installed Airflow's RECORD), ``series`` (the
series and its record of verified releases), ``safe_write`` (temporary files, atomic
replace, bytecode), ``locations`` (where ``patches/`` is) and ``applier``.
"""
