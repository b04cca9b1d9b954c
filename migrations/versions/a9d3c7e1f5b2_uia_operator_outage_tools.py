"""the operator's outage tools: response headers kept with each attempt, discards as jobs

Revision ID: a9d3c7e1f5b2
Revises: d8f3b5a1c7e9
Create Date: 2026-12-03 07:00:00.000000

- attempts.response_headers: the receiver's answer headers, as "Name: value" lines, at most 4 KB;
- replays.kind: a row is a replay or a discard (both are jobs over dead letters with progress);
- ix_deliveries_discarded: retention finds the oldest discarded rows without reading the rest.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'a9d3c7e1f5b2'
down_revision = 'd8f3b5a1c7e9'  # after the owner and on-call tools' migration
branch_labels = None
depends_on = None

_DISCARDED = sa.text("state = 'discarded'")


def upgrade():
    op.add_column("attempts", sa.Column("response_headers", sa.Text(), nullable=True))
    op.add_column("replays", sa.Column("kind", sa.String(16), nullable=False, server_default="replay"))
    op.create_index("ix_deliveries_discarded", "deliveries", ["dead_lettered_at"],
                    postgresql_where=_DISCARDED, sqlite_where=_DISCARDED)


def downgrade():
    op.drop_index("ix_deliveries_discarded", table_name="deliveries")
    op.drop_column("replays", "kind")
    op.drop_column("attempts", "response_headers")
