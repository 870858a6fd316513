"""
Source patches: the fix as unified diffs against the installed Airflow files.

The patches are generated (``generator``) from the same fixed members that the shim
installs (``airflow_dataset_race_fix.fix``), and applied or reverted (``applier``) with
the checks an image build needs: the installed Airflow version, the wheel's RECORD hash
of every target file, a dry run, temporary files and atomic replace, backups and fresh
bytecode. Nothing in this package imports Airflow: it works on files, so that it can
patch a site-packages directory other than the running interpreter's.

Modules: ``members`` (find a class member's source lines), ``unidiff`` (strict unified
diff parser and applier), ``wheels`` (RECORD files and cached release wheels),
``safe_write`` (temporary files, atomic replace, bytecode), ``locations`` (where
``patches/`` is), ``generator`` and ``applier``.
"""
