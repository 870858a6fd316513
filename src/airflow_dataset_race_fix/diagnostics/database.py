"""
The metadata database as ``audit`` and ``explain`` open it, creating nothing (no AIRFLOW_HOME,
log directory or database file): Airflow is imported as a library (``_AIRFLOW__AS_LIBRARY``:
configuration read; logging, which creates ``logs/``, and the ORM, which opens the database,
not set up), and SQLite is opened read-only (``mode=ro``) unless ``--requeue --yes`` writes.
"""

from __future__ import annotations

import configparser
import contextlib
import importlib.util
import os
import sys
import warnings
from urllib.parse import quote

REQUIRED_TABLES = (
    "alembic_version",
    "dag",
    "dag_run",
    "dag_schedule_dataset_reference",
    "dagrun_dataset_event",
    "dataset",
    "dataset_dag_run_queue",
    "dataset_event",
    "serialized_dag",
)
# Alembic heads of the schemas the audit reads: 2.10.0-2.10.2, and 2.10.3-2.11.x (2.11 added no migration).
SUPPORTED_REVISIONS = {"22ed7efa9da2": "2.10.0", "5f2621c13b39": "2.10.3"}
# SQLAlchemy backend names of the databases Airflow 2.10/2.11 supports.
SUPPORTED_BACKENDS = ("postgresql", "mysql", "sqlite")
# The packages of the drivers Airflow's own extras install (SQLAlchemy's defaults for these backends).
DRIVER_PACKAGES = {"postgresql+psycopg2": "psycopg2-binary", "mysql+mysqldb": "mysqlclient"}
CHECK_HOME_HINT = (
    "check AIRFLOW_HOME (or --db-url), and run 'airflow db migrate' if the database was never migrated"
)


class DatabaseError(Exception):
    """The metadata database cannot be opened as asked (no Airflow here, no AIRFLOW_HOME, a bad URL or
    driver, not an Airflow 2.10/2.11 schema): one clear line, which the CLI prints with exit status 2."""


def prepare_airflow_import(db_url: str | None) -> None:
    """Check that Airflow can be imported here without creating anything, before it is. An
    AIRFLOW_HOME that does not exist is no Airflow's home: Airflow would create it, and a database."""
    if importlib.util.find_spec("airflow") is None:
        raise DatabaseError(
            f"Apache Airflow is not installed in {sys.executable}: run audit where Airflow runs"
        )
    if "airflow" not in sys.modules:
        os.environ["_AIRFLOW__AS_LIBRARY"] = (
            "1"  # no logging or ORM set-up at import (see the module's docstring)
        )
        # Airflow's deprecation notices (2.11 prints some at import) are not the audit's output,
        # whose stderr is one line per error: with a warnings option set, Airflow keeps its own
        # "show deprecations" filter out.
        if not sys.warnoptions:
            sys.warnoptions.append("ignore::DeprecationWarning")
            warnings.simplefilter("ignore", DeprecationWarning)
    if db_url is None:
        home = os.path.expanduser(os.path.expandvars(os.environ.get("AIRFLOW_HOME", "~/airflow")))
        if not os.path.isdir(home):
            raise DatabaseError(
                f"AIRFLOW_HOME {home} is not a directory, so no Airflow configuration names the metadata "
                "database: set AIRFLOW_HOME to your Airflow's home, or pass --db-url"
            )


def open_database(db_url: str | None, *, read_only: bool):
    """The engine to audit, checked to reach an Airflow 2.10/2.11 schema; (engine, redacted URL)."""
    if db_url is None:
        from airflow.configuration import conf
        from airflow.exceptions import AirflowConfigException

        source = "[database] sql_alchemy_conn"
        try:
            url = conf.get("database", "sql_alchemy_conn")
            has_args = conf.has_option("database", "sql_alchemy_connect_args")
            connect_args = conf.getimport("database", "sql_alchemy_connect_args") if has_args else {}
        except AirflowConfigException as err:
            raise DatabaseError(f"Airflow's configuration: {first_line(err)}") from None
    else:
        source, url, connect_args = "--db-url", db_url, {}
    engine, where = _engine_for(url, source, connect_args, read_only=read_only)
    _check_schema(engine, where)
    return engine, where


def _engine_for(url: str, source: str, connect_args: dict, *, read_only: bool):
    """(An engine set up as Airflow sets up its own: UTC on MySQL, READ COMMITTED; the URL redacted
    for messages). Bad URLs and missing drivers are DatabaseErrors."""
    from airflow.utils.orm_event_handlers import setup_event_handlers
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError
    from sqlalchemy.pool import NullPool

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as err:
        raise DatabaseError(f"{source}: not a valid database URL: {err}") from None
    where = parsed.render_as_string(hide_password=True)
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED_BACKENDS:
        raise DatabaseError(
            f"{source}: unsupported backend {backend!r}: Airflow 2.10/2.11 metadata databases are "
            "PostgreSQL, MySQL/MariaDB or SQLite"
        )
    if backend == "sqlite":
        parsed = _sqlite_url(parsed, source, read_only=read_only)
    options: dict = {"poolclass": NullPool, "connect_args": connect_args}
    if backend == "mysql":
        options["isolation_level"] = "READ COMMITTED"
    try:
        engine = create_engine(parsed, **options)
    except (NoSuchModuleError, ImportError) as err:
        package = DRIVER_PACKAGES.get(f"{backend}+{parsed.get_driver_name()}")
        hint = f" (pip install {package})" if package else ""
        raise DatabaseError(
            f"{source}: the driver for {parsed.drivername} is not installed: {err}{hint}"
        ) from None
    except (ArgumentError, TypeError, ValueError) as err:
        raise DatabaseError(f"{source}: bad database URL argument: {err}") from None
    setup_event_handlers(engine)
    return engine, where


def _sqlite_url(url, source: str, *, read_only: bool):
    """A SQLite URL that opens an existing file (read-only unless ``read_only`` is false) and
    never creates one: SQLite makes an empty file on a plain open of a missing path."""
    database = url.database or ""
    if url.query.get("uri") == "true" and database.startswith("file:"):
        return url  # already an SQLite URI: opened as its own query says
    if database in ("", ":memory:"):
        raise DatabaseError(
            f"{source}: an in-memory SQLite database has no Airflow tables; give a file's URL"
        )
    path = os.path.abspath(database)
    if not os.path.isfile(path):
        raise DatabaseError(f"{source}: no SQLite database file at {path}; {CHECK_HOME_HINT}")
    mode = "ro" if read_only else "rw"
    return url.set(database=f"file:{quote(path)}").update_query_dict({"mode": mode, "uri": "true"})


def _check_schema(engine, where: str) -> None:
    from sqlalchemy import inspect, text
    from sqlalchemy.exc import SQLAlchemyError

    try:
        conn = engine.connect()
    except SQLAlchemyError as err:
        raise DatabaseError(
            f"cannot connect to the metadata database at {where}: {first_line(err)}"
        ) from None
    try:
        tables = set(inspect(conn).get_table_names())
        missing = [t for t in REQUIRED_TABLES if t not in tables]
        if missing:
            raise DatabaseError(
                f"{where} is not an Airflow 2.10/2.11 metadata database: missing tables "
                f"{', '.join(missing)}; {CHECK_HOME_HINT}"
            )
        revisions = list(conn.scalars(text("SELECT version_num FROM alembic_version")))
    except SQLAlchemyError as err:
        raise DatabaseError(f"cannot read the metadata database at {where}: {first_line(err)}") from None
    finally:
        conn.close()
    if not any(r in SUPPORTED_REVISIONS for r in revisions):
        raise DatabaseError(
            f"{where} is not an Airflow 2.10/2.11 metadata database: alembic revision "
            f"{', '.join(revisions) or 'none'}{_airflow_release(revisions)}; the audit reads the 2.10 schema "
            f"(revisions {', '.join(SUPPORTED_REVISIONS)})"
        )


def _airflow_release(revisions: list[str]) -> str:
    try:
        from airflow.utils.db import _REVISION_HEADS_MAP
    except ImportError:
        return ""
    releases = [version for version, head in _REVISION_HEADS_MAP.items() if head in revisions]
    return f" (Airflow {releases[-1]}'s schema)" if releases else ""


def first_line(err: BaseException) -> str:
    text = str(getattr(err, "orig", None) or err).strip()
    return text.splitlines()[0] if text else type(err).__name__


@contextlib.contextmanager
def reading(db_url: str | None, *, read_only: bool = True):
    """(session, engine, where): the metadata database as the commands read it, in one snapshot (REPEATABLE
    READ, and READ ONLY unless ``read_only`` is False, where the backend has them), closed after. Airflow
    that cannot be imported here and a failed read are DatabaseErrors: one line, exit 2."""
    prepare_airflow_import(db_url)
    try:
        import airflow.models.dag  # noqa: F401  (what the commands read with: a broken install says so here)
        from airflow import settings
        from sqlalchemy import text
        from sqlalchemy.exc import SQLAlchemyError
        from sqlalchemy.orm import Session
    except (ImportError, configparser.Error) as err:  # a broken install, an unreadable airflow.cfg
        raise DatabaseError(f"cannot import Airflow here: {first_line(err)}") from None
    # What _AIRFLOW__AS_LIBRARY skips and the commands need: the configured folders (deserializing a DAG
    # loads the plugins) and the drivers' adapters for pendulum datetimes.
    if settings.PLUGINS_FOLDER is None:
        settings.configure_vars()
        settings.configure_adapters()
    engine, where = open_database(db_url, read_only=read_only)
    servers = engine.dialect.name in ("postgresql", "mysql")
    try:
        with engine.connect() as connection:
            if servers:
                connection = connection.execution_options(isolation_level="REPEATABLE READ")
            with Session(bind=connection) as session:  # closed after: rolled back, nothing to commit
                if servers and read_only:  # a write or a row lock fails
                    session.execute(text("SET TRANSACTION READ ONLY"))
                yield session, engine, where
    except SQLAlchemyError as err:
        raise DatabaseError(f"reading {where} failed: {first_line(err)}") from None
