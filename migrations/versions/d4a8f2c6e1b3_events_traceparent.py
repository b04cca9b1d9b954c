"""events: the producer's W3C traceparent, sent on every delivery attempt (issue 41)

Revision ID: d4a8f2c6e1b3
Revises: b8e4f2a6d1c3
Create Date: 2026-12-06 18:05:00.000000

Nullable and without a default: an event published without one costs nothing, and the rows stored before
it have none.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'd4a8f2c6e1b3'
down_revision = 'b8e4f2a6d1c3'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('events', sa.Column('traceparent', sa.String(length=55), nullable=True))


def downgrade():
    op.drop_column('events', 'traceparent')  # in place on SQLite 3.35 and later
