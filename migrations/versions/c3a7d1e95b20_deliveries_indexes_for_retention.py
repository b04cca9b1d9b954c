"""deliveries: a partial index retention's pruning reads (oldest succeeded; the oldest dead come from ix_deliveries_dead)

Revision ID: c3a7d1e95b20
Revises: c4e8a2f61b07
Create Date: 2026-11-30 12:20:00.000000

Pruning takes the oldest settled deliveries of one kind past a cutoff, a batch at a time; without
these it would read every delivery. Each holds only the rows of its state, so a pending delivery
adds no entry, and a settle (already an update of indexed columns) adds one.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'c3a7d1e95b20'
down_revision = 'c4e8a2f61b07'
branch_labels = None
depends_on = None

_SUCCEEDED = sa.text("state = 'succeeded'")


def upgrade():
    op.create_index("ix_deliveries_succeeded", "deliveries", ["succeeded_at"],
                    postgresql_where=_SUCCEEDED, sqlite_where=_SUCCEEDED)


def downgrade():
    op.drop_index("ix_deliveries_succeeded", table_name="deliveries")
