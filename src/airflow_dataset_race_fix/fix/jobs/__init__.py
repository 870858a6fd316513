"""Fixed members of ``airflow.jobs``."""
