"""Fixed members of ``airflow.datasets``."""
