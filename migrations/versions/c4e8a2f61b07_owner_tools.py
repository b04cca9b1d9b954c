"""owner tools: a previous secret signing until its grace ends, a rate limit and an in-flight cap
per subscription, and soft deletion

Revision ID: c4e8a2f61b07
Revises: c4e8b2a7d915
Create Date: 2026-11-30 12:30:00.000000
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'c4e8a2f61b07'
down_revision = 'c4e8b2a7d915'
branch_labels = None
depends_on = None


def upgrade():
    # Nullable columns without defaults: a plain ADD COLUMN on SQLite too. A batch would copy and drop
    # `subscriptions`, which the deliveries' foreign keys refuse once there are deliveries.
    op.add_column('subscriptions', sa.Column('previous_secret_ciphertext', sa.Text(), nullable=True))
    op.add_column('subscriptions', sa.Column('previous_secret_expires_at', sa.DateTime(), nullable=True))
    op.add_column('subscriptions', sa.Column('rate_limit_per_s', sa.Float(), nullable=True))
    op.add_column('subscriptions', sa.Column('max_in_flight', sa.Integer(), nullable=True))
    op.add_column('subscriptions', sa.Column('deleted_at', sa.DateTime(), nullable=True))


def downgrade():
    # DROP COLUMN in place (SQLite 3.35+), for the same reason as above.
    for column in ('deleted_at', 'max_in_flight', 'rate_limit_per_s', 'previous_secret_expires_at',
                   'previous_secret_ciphertext'):
        op.drop_column('subscriptions', column)
