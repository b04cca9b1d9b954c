"""owner tools: a previous secret signing until its grace ends, a rate limit and an in-flight cap
per subscription, and soft deletion

Revision ID: c4e8a2f61b07
Revises: a1d7c3e5f209
Create Date: 2026-11-30 12:30:00.000000
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'c4e8a2f61b07'
down_revision = 'a1d7c3e5f209'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('subscriptions') as batch:
        batch.add_column(sa.Column('previous_secret_ciphertext', sa.Text(), nullable=True))
        batch.add_column(sa.Column('previous_secret_expires_at', sa.DateTime(), nullable=True))
        batch.add_column(sa.Column('rate_limit_per_s', sa.Float(), nullable=True))
        batch.add_column(sa.Column('max_in_flight', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('deleted_at', sa.DateTime(), nullable=True))


def downgrade():
    with op.batch_alter_table('subscriptions') as batch:
        batch.drop_column('deleted_at')
        batch.drop_column('max_in_flight')
        batch.drop_column('rate_limit_per_s')
        batch.drop_column('previous_secret_expires_at')
        batch.drop_column('previous_secret_ciphertext')
