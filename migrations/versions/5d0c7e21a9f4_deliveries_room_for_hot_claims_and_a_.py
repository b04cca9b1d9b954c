"""deliveries: room for HOT claims, and a due index that holds only what can come due

Revision ID: 5d0c7e21a9f4
Revises: 408bc71cd68e
Create Date: 2026-11-29 23:20:00.000000

A claim changes only lease columns, which no index holds; with free room on its page PostgreSQL
writes it as a heap-only (HOT) update and touches no index. ix_deliveries_due keeps only rows
with a next attempt: a settled delivery (next_attempt_at NULL) leaves it instead of adding one
more entry per delivery forever.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '5d0c7e21a9f4'
down_revision = '408bc71cd68e'
branch_labels = None
depends_on = None

DUE = sa.text("next_attempt_at IS NOT NULL")


def upgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE deliveries SET (fillfactor = 70)")  # new pages only; VACUUM FULL rewrites old ones
    op.drop_index("ix_deliveries_due", table_name="deliveries")
    op.create_index("ix_deliveries_due", "deliveries", ["state", "next_attempt_at"],
                    postgresql_where=DUE, sqlite_where=DUE)


def downgrade():
    op.drop_index("ix_deliveries_due", table_name="deliveries")
    op.create_index("ix_deliveries_due", "deliveries", ["state", "next_attempt_at"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE deliveries RESET (fillfactor)")
