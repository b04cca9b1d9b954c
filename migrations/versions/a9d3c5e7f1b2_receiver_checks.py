"""checks: the receiver check of a subscription's endpoint, one row per run

Revision ID: a9d3c5e7f1b2
Revises: a9d3c7e1f5b2
Create Date: 2026-12-03 07:00:00.000000

A check's requests are kept apart from deliveries: its row holds the results, and no delivery or
attempt is written for it. At most one running check per subscription (a partial unique index).
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'a9d3c5e7f1b2'
down_revision = 'a9d3c7e1f5b2'  # after the operator tools' migration
branch_labels = None
depends_on = None

RUNNING = sa.text("state = 'running'")


def upgrade():
    op.create_table(
        'checks',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('subscription_id', sa.String(length=40), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('started_at', sa.DateTime(), nullable=False),
        sa.Column('finished_at', sa.DateTime(), nullable=True),
        sa.Column('results', sa.JSON(), nullable=True),
        sa.Column('requested_by', sa.String(length=254), nullable=False),
        sa.Column('error', sa.String(length=500), nullable=True),
        sa.ForeignKeyConstraint(['subscription_id'], ['subscriptions.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_checks_subscription_started', 'checks', ['subscription_id', 'started_at'])
    op.create_index('uq_checks_running', 'checks', ['subscription_id'], unique=True,
                    postgresql_where=RUNNING, sqlite_where=RUNNING)


def downgrade():
    op.drop_index('uq_checks_running', table_name='checks')
    op.drop_index('ix_checks_subscription_started', table_name='checks')
    op.drop_table('checks')
