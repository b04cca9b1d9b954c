"""SQLAlchemy helpers shared by the claims and the ordering store. SQLAlchemy is imported
here lazily, only when a SQL-backed object is built, so ``promesa_receiver`` itself needs
nothing beyond the standard library."""

from __future__ import annotations

MAX_ID_LENGTH = 255


def sqlalchemy():
    try:
        import sqlalchemy as sa
    except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
        raise ImportError("the SQL-backed receiver helpers need SQLAlchemy: install 'promesa-receiver[sql]'") from exc
    return sa


def engine_from(engine_or_connection_url):
    """An Engine from an Engine, a URL string or a ``sqlalchemy.URL``."""
    sa = sqlalchemy()
    if isinstance(engine_or_connection_url, sa.engine.Engine):
        return engine_or_connection_url
    if isinstance(engine_or_connection_url, (str, sa.engine.URL)):
        return sa.create_engine(engine_or_connection_url)
    raise TypeError("pass a SQLAlchemy Engine or a database URL, not "
                    f"{type(engine_or_connection_url).__name__}")


def insert_unless_conflict(conn, statement) -> bool:
    """Run an INSERT on ``conn`` inside its current transaction; False if it hit a unique or
    primary key constraint. The transaction stays usable either way.

    PostgreSQL aborts the whole transaction on an error, so the INSERT runs in a SAVEPOINT.
    SQLite rolls back only the failing statement, and with the pysqlite driver a SAVEPOINT
    issued before the transaction's first write would escape the transaction, so there the
    INSERT runs plainly."""
    sa = sqlalchemy()
    if conn.dialect.name == "sqlite":
        try:
            conn.execute(statement)
        except sa.exc.IntegrityError:
            return False
        return True
    try:
        with conn.begin_nested():
            conn.execute(statement)
    except sa.exc.IntegrityError:
        return False
    return True


def check_id(value, what: str = "event id") -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string")
    if len(value) > MAX_ID_LENGTH:
        raise ValueError(f"{what} is {len(value)} characters; at most {MAX_ID_LENGTH} are stored")
    return value
