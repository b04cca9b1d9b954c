"""deliveries: a partial index of the owed rows, for the overview's backlog per subscription

Revision ID: d5b1e7a9c3f2
Revises: c3a7d1e95b20
Create Date: 2026-11-30 15:40:00.000000

The overview counts each subscription's pending, scheduled, held and dead deliveries and finds its
oldest due one on every refresh. Read from ix_deliveries_subscription_state, which holds every
delivery ever made, those counts were most of the page at 500,000 deliveries; this index holds the
owed rows alone. A succeeded delivery leaves it (no entry for the new row version).
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'd5b1e7a9c3f2'
down_revision = 'c3a7d1e95b20'
branch_labels = None
depends_on = None

_OWED = sa.text("state IN ('pending', 'scheduled', 'held', 'dead')")


def upgrade():
    op.create_index("ix_deliveries_owed", "deliveries", ["subscription_id", "state", "next_attempt_at"],
                    postgresql_where=_OWED, sqlite_where=_OWED)


def downgrade():
    op.drop_index("ix_deliveries_owed", table_name="deliveries")
