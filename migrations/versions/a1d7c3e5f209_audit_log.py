"""audit log: who changed what, when, from the dashboard, the API or the system

Revision ID: a1d7c3e5f209
Revises: 9b4e2f6c1d83
Create Date: 2026-11-30 12:40:00.000000
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'a1d7c3e5f209'
down_revision = '9b4e2f6c1d83'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'audit_entries',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
        sa.Column('at', sa.DateTime(), nullable=False),
        sa.Column('actor_kind', sa.String(length=10), nullable=False),
        sa.Column('actor', sa.String(length=254), nullable=False),
        sa.Column('action', sa.String(length=60), nullable=False),
        sa.Column('team_id', sa.Integer(), nullable=True),
        sa.Column('subscription_id', sa.String(length=40), nullable=True),
        sa.Column('target', sa.String(length=120), nullable=True),
        sa.Column('deliveries', sa.Integer(), nullable=True),
        sa.Column('detail', sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_audit_entries_at', 'audit_entries', ['at'])
    op.create_index('ix_audit_entries_action', 'audit_entries', ['action'])
    op.create_index('ix_audit_entries_subscription_at', 'audit_entries', ['subscription_id', 'at'])
    op.create_index('ix_audit_entries_team_at', 'audit_entries', ['team_id', 'at'])


def downgrade():
    op.drop_table('audit_entries')
