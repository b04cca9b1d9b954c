"""deliveries: partial indexes retention's pruning reads (oldest succeeded, oldest dead)

Revision ID: c3a7d1e95b20
Revises: 9b4e2f6c1d83
Create Date: 2026-11-30 12:20:00.000000

Pruning takes the oldest settled deliveries of one kind past a cutoff, a batch at a time; without
these it would read every delivery. Each holds only the rows of its state, so a pending delivery
adds no entry, and a settle (already an update of indexed columns) adds one.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'c3a7d1e95b20'
down_revision = '9b4e2f6c1d83'
branch_labels = None
depends_on = None

_SUCCEEDED = sa.text("state = 'succeeded'")
_DEAD = sa.text("state = 'dead'")


def upgrade():
    op.create_index("ix_deliveries_succeeded", "deliveries", ["succeeded_at"],
                    postgresql_where=_SUCCEEDED, sqlite_where=_SUCCEEDED)
    op.create_index("ix_deliveries_dead", "deliveries", ["dead_lettered_at"],
                    postgresql_where=_DEAD, sqlite_where=_DEAD)


def downgrade():
    op.drop_index("ix_deliveries_dead", table_name="deliveries")
    op.drop_index("ix_deliveries_succeeded", table_name="deliveries")
