"""subscriptions: a pull subscription's own key, which pulls and acks it and nothing else (issue 40)

Revision ID: b8e4f2a6d1c3
Revises: b6e3f9a2c8d4
Create Date: 2026-12-06 17:20:00.000000

Kept as its SHA-256 (unique: a key names its subscription) and its first characters, as API tokens are.
Pull subscriptions made before it have none until their key is rotated; their team's tokens still pull them.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'b8e4f2a6d1c3'
down_revision = 'b6e3f9a2c8d4'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('subscriptions', sa.Column('pull_key_sha256', sa.String(length=64), nullable=True))
    op.add_column('subscriptions', sa.Column('pull_key_prefix', sa.String(length=16), nullable=True))
    op.create_index('uq_subscriptions_pull_key_sha256', 'subscriptions', ['pull_key_sha256'], unique=True)


def downgrade():
    op.drop_index('uq_subscriptions_pull_key_sha256', table_name='subscriptions')
    op.drop_column('subscriptions', 'pull_key_prefix')
    op.drop_column('subscriptions', 'pull_key_sha256')
