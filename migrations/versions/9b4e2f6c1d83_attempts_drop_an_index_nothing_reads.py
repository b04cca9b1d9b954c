"""attempts: drop ix_attempts_attempted_at, an index nothing reads

Revision ID: 9b4e2f6c1d83
Revises: 5d0c7e21a9f4
Create Date: 2026-11-29 23:40:00.000000

Attempts are only ever read by delivery (ix_attempts_delivery_number); the attempted_at index
cost one more entry for every attempt written.
"""
from alembic import op


# revision identifiers, used by Alembic.
revision = '9b4e2f6c1d83'
down_revision = '5d0c7e21a9f4'
branch_labels = None
depends_on = None


def upgrade():
    op.drop_index("ix_attempts_attempted_at", table_name="attempts")


def downgrade():
    op.create_index("ix_attempts_attempted_at", "attempts", ["attempted_at"])
