"""
Scratch metadata databases on the three backends, and pointing Airflow at one.

Each run creates its own database (``adrf_<random>``, or a name of the caller's that does not
exist) on the server and drops it at the end, never touching other databases. Server URLs come
from the environment, with loopback defaults matching the CI machine:

- ``ADRF_POSTGRES_URL`` (default ``postgresql+psycopg2://postgres@127.0.0.1:5432/test``)
- ``ADRF_MYSQL_URL`` (default ``mysql+mysqldb://root@127.0.0.1:3306/test``)

The database named in the URL is only used to run CREATE/DROP DATABASE. SQLite needs no
server: the database is a file in a temporary directory.

Nothing here imports Airflow: ``configure_airflow_env`` must run before Airflow reads
its configuration.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from dataclasses import dataclass, field

BACKENDS = ("sqlite", "postgres", "mysql")
SERVER_URL_ENV = {"postgres": "ADRF_POSTGRES_URL", "mysql": "ADRF_MYSQL_URL"}
DEFAULT_SERVER_URLS = {
    "postgres": "postgresql+psycopg2://postgres@127.0.0.1:5432/test",
    "mysql": "mysql+mysqldb://root@127.0.0.1:3306/test",
}


# Airflow's [database] sql_alchemy_connect_args for the SQLite test databases: several
# producer processes wait for SQLite's single write lock; on a loaded 2-core machine the
# default 5 s busy timeout turns that wait into "database is locked" failures.
SQLITE_CONNECT_ARGS = {"timeout": 60, "check_same_thread": False}


class DatabaseUnavailable(RuntimeError):
    """The database server cannot be reached or refused to create a database."""


class DatabaseExists(DatabaseUnavailable):
    """A database of the chosen name exists: not ours, so neither used nor dropped."""


def server_url(backend: str) -> str:
    return os.environ.get(SERVER_URL_ENV[backend], DEFAULT_SERVER_URLS[backend])


@dataclass
class ScratchDatabase:
    """A database of our own on ``backend``; ``url`` is what Airflow connects to."""

    backend: str
    server: str | None = None
    name: str = field(default_factory=lambda: "adrf_" + secrets.token_hex(4))
    url: str = ""
    _tmpdir: tempfile.TemporaryDirectory | None = None

    def create(self) -> str:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.backend == "sqlite":
            self._tmpdir = tempfile.TemporaryDirectory(prefix="adrf-sqlite-")
            self.url = f"sqlite:///{self._tmpdir.name}/airflow.db"
            return self.url
        from sqlalchemy.engine import make_url

        self.server = self.server or server_url(self.backend)
        if self.exists():  # CREATE would fail too; this says why, and drop() drops only what create() made
            raise DatabaseExists(
                f"database {self.name!r} already exists on the {self.backend} server "
                f"at {_redacted(self.server)}; a scratch database is created for the run and dropped "
                "after it, and one that exists is never used or dropped: choose a name that does "
                "not exist (or drop it yourself)"
            )
        if self.backend == "postgres":
            self._admin(f'CREATE DATABASE "{self.name}"')
        else:
            self._admin(f"CREATE DATABASE `{self.name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
        self.url = make_url(self.server).set(database=self.name).render_as_string(hide_password=False)
        return self.url

    def drop(self) -> None:
        if self.backend == "sqlite":
            if self._tmpdir is not None:
                self._tmpdir.cleanup()
            return
        if not self.url:
            return
        if self.backend == "postgres":
            self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        else:
            self._admin(f"DROP DATABASE IF EXISTS `{self.name}`")
        self.url = ""

    def exists(self) -> bool:
        self.server = self.server or server_url(self.backend)
        if self.backend == "postgres":
            return bool(self._admin("SELECT count(*) FROM pg_database WHERE datname = :name"))
        return bool(self._admin("SELECT count(*) FROM information_schema.schemata WHERE schema_name = :name"))

    def _admin(self, statement: str):
        from sqlalchemy import create_engine, text
        from sqlalchemy.exc import SQLAlchemyError

        engine = create_engine(self.server, isolation_level="AUTOCOMMIT", pool_pre_ping=False)
        try:
            with engine.connect() as conn:
                result = conn.execute(text(statement), {"name": self.name} if ":name" in statement else {})
                return result.scalar() if result.returns_rows else None
        except SQLAlchemyError as err:
            raise DatabaseUnavailable(
                f"{self.backend} server at {_redacted(self.server)} failed '{statement}': "
                f"{getattr(err, 'orig', err)}"
            ) from None
        finally:
            engine.dispose()


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def configure_airflow_env(sql_alchemy_conn: str, airflow_home: str) -> str:
    """Point Airflow (not yet imported) at ``sql_alchemy_conn`` with quiet, test-friendly settings.

    ``airflow_home`` is the caller's to remove when done (Airflow writes logs and its config there).
    """
    os.makedirs(os.path.join(airflow_home, "dags"), exist_ok=True)
    settings = {
        "AIRFLOW_HOME": airflow_home,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sql_alchemy_conn,
        "AIRFLOW__CORE__DAGS_FOLDER": os.path.join(airflow_home, "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": os.environ.get("ADRF_AIRFLOW_LOG_LEVEL", "WARNING"),
        "AIRFLOW__SCHEDULER__MIN_SERIALIZED_DAG_FETCH_INTERVAL": "0",
    }
    if sql_alchemy_conn.startswith("sqlite"):
        settings["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"] = f"{__name__}.SQLITE_CONNECT_ARGS"
    os.environ.update(settings)
    return airflow_home


def init_airflow_db() -> None:
    """Create Airflow's schema in the (empty) configured database, as ``airflow db migrate`` would."""
    from airflow.utils.db import initdb

    initdb(load_connections=False)
