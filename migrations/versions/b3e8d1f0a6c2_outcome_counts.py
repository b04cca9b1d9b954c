"""outcome counts: attempts per subscription per minute, by outcome, for charts and alert rules

Revision ID: b3e8d1f0a6c2
Revises: a1d7c3e5f209
Create Date: 2026-11-30 12:50:00.000000
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'b3e8d1f0a6c2'
down_revision = 'a1d7c3e5f209'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'outcome_counts',
        sa.Column('subscription_id', sa.String(length=40), nullable=False),
        sa.Column('minute', sa.DateTime(), nullable=False),
        sa.Column('succeeded', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('failed', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('dead', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('duration_ms', sa.BigInteger(), nullable=False, server_default='0'),
        sa.PrimaryKeyConstraint('subscription_id', 'minute'),
    )


def downgrade():
    op.drop_table('outcome_counts')
