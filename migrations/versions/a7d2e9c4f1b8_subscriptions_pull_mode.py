"""subscriptions: push or pull (issue 40); a pull subscription has no URL

Revision ID: a7d2e9c4f1b8
Revises: f4c1a8e3b7d5
Create Date: 2026-12-06 14:30:00.000000

mode: 'push' (POSTed to its URL by the workers, every subscription so far) or 'pull' (its deliveries are
leased to the client that fetches them). url becomes nullable: a pull subscription has none.

On SQLite a column loses NOT NULL only by a rebuild of the table, and a batch rebuild drops `subscriptions`
under the foreign keys of deliveries, checks, incidents... (PRAGMA foreign_keys is on, and cannot be turned
off inside the migration's transaction). So the constraint is removed the way SQLite documents for removing
a NOT NULL constraint (https://www.sqlite.org/lang_altertable.html, "Making Other Kinds Of Table Schema
Changes"): the CREATE TABLE text is edited in place and the schema version bumped, in the same transaction.
Nothing on disk changes: the rows already satisfy the looser table.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'a7d2e9c4f1b8'
down_revision = 'f4c1a8e3b7d5'
branch_labels = None
depends_on = None

NOT_NULL_URL = "url VARCHAR(2048) NOT NULL"
NULLABLE_URL = "url VARCHAR(2048)"


def _rewrite_sqlite_url(before: str, after: str) -> None:
    conn = op.get_bind()
    version = conn.exec_driver_sql("PRAGMA schema_version").scalar()
    conn.exec_driver_sql("PRAGMA writable_schema=ON")
    try:
        changed = conn.execute(sa.text("UPDATE sqlite_master SET sql = replace(sql, :before, :after) "
                                       "WHERE type = 'table' AND name = 'subscriptions' AND instr(sql, :before) > 0"),
                               {"before": before, "after": after}).rowcount
        if changed != 1:
            raise RuntimeError(f"subscriptions' CREATE TABLE does not read {before!r}: change it by hand")
        conn.exec_driver_sql(f"PRAGMA schema_version={version + 1}")
    finally:
        conn.exec_driver_sql("PRAGMA writable_schema=OFF")


def upgrade():
    op.add_column('subscriptions', sa.Column('mode', sa.String(length=8), nullable=False, server_default='push'))
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column('subscriptions', 'url', existing_type=sa.String(length=2048), nullable=True)
    else:
        _rewrite_sqlite_url(NOT_NULL_URL, NULLABLE_URL)


def downgrade():
    pull = op.get_bind().scalar(sa.text("SELECT count(*) FROM subscriptions WHERE mode = 'pull'"))
    if pull:
        raise RuntimeError(f"{pull} subscriptions are pull subscriptions, which the old schema cannot hold: "
                           "delete them first")
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column('subscriptions', 'url', existing_type=sa.String(length=2048), nullable=False)
    else:
        _rewrite_sqlite_url(NULLABLE_URL, NOT_NULL_URL)
    op.drop_column('subscriptions', 'mode')  # in place on SQLite 3.35 and later
