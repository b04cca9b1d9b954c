"""incidents, their rules, notification sinks, and what the sweeper folds for rules and /metrics

Revision ID: c7a4e9b2d5f1
Revises: c41d7e9a0b52
Create Date: 2026-11-30 13:00:00.000000
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'c7a4e9b2d5f1'
down_revision = 'c41d7e9a0b52'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'incidents',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('subscription_id', sa.String(length=40), nullable=True),
        sa.Column('team_id', sa.Integer(), nullable=True),
        sa.Column('rule', sa.String(length=32), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('opened_at', sa.DateTime(), nullable=False),
        sa.Column('acknowledged_at', sa.DateTime(), nullable=True),
        sa.Column('acknowledged_by', sa.String(length=254), nullable=True),
        sa.Column('resolved_at', sa.DateTime(), nullable=True),
        sa.Column('first_seen_at', sa.DateTime(), nullable=False),
        sa.Column('last_seen_at', sa.DateTime(), nullable=False),
        sa.Column('figures', sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    unresolved = sa.text('resolved_at IS NULL')
    op.create_index('uq_incidents_unresolved', 'incidents', [sa.text("coalesce(subscription_id, '')"), 'rule'],
                    unique=True, postgresql_where=unresolved, sqlite_where=unresolved)
    op.create_index('ix_incidents_opened_at', 'incidents', ['opened_at'])
    op.create_table(
        'incident_rules',
        sa.Column('subscription_id', sa.String(length=40), sa.ForeignKey('subscriptions.id'), nullable=False),
        sa.Column('rule', sa.String(length=32), nullable=False),
        sa.Column('enabled', sa.Boolean(), nullable=False),
        sa.Column('threshold', sa.Float(), nullable=True),
        sa.Column('window_minutes', sa.Integer(), nullable=True),
        sa.Column('min_attempts', sa.Integer(), nullable=True),
        sa.Column('updated_at', sa.DateTime(), nullable=False),
        sa.Column('updated_by', sa.String(length=254), nullable=False),
        sa.PrimaryKeyConstraint('subscription_id', 'rule'),
    )
    op.create_table(
        'subscription_health',
        sa.Column('subscription_id', sa.String(length=40), nullable=False),
        sa.Column('succeeded_total', sa.BigInteger(), nullable=False, server_default='0'),
        sa.Column('failed_total', sa.BigInteger(), nullable=False, server_default='0'),
        sa.Column('dead_total', sa.BigInteger(), nullable=False, server_default='0'),
        sa.Column('failing_since', sa.DateTime(), nullable=True),
        sa.Column('streak_failures', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('disable_clock_started_at', sa.DateTime(), nullable=True),
        sa.Column('last_failure_at', sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint('subscription_id'),
    )
    op.create_table(
        'sweep_marks',
        sa.Column('name', sa.String(length=40), nullable=False),
        sa.Column('at', sa.DateTime(), nullable=True),
        sa.Column('position', sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint('name'),
    )
    op.create_table(
        'metric_counters',
        sa.Column('name', sa.String(length=60), nullable=False),
        sa.Column('value', sa.BigInteger(), nullable=False, server_default='0'),
        sa.PrimaryKeyConstraint('name'),
    )
    op.create_table(
        'notification_sinks',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('subscription_id', sa.String(length=40), sa.ForeignKey('subscriptions.id'), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('created_by', sa.String(length=254), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('subscription_id'),
    )


def downgrade():
    op.drop_table('notification_sinks')
    op.drop_table('metric_counters')
    op.drop_table('sweep_marks')
    op.drop_table('subscription_health')
    op.drop_table('incident_rules')
    op.drop_index('ix_incidents_opened_at', table_name='incidents')
    op.drop_index('uq_incidents_unresolved', table_name='incidents')
    op.drop_table('incidents')
