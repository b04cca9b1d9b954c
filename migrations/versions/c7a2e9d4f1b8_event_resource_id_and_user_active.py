"""events.resource_id (searchable, indexed; filled at ingest from data.resource_id), events by type, users.active,
and outcome_hours (outcome counts rolled up per hour, for the dashboard's charts)

Revision ID: c7a2e9d4f1b8
Revises: c3f1a7e9d2b4
Create Date: 2026-11-30 13:20:00.000000
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'c7a2e9d4f1b8'
down_revision = 'c3f1a7e9d2b4'
branch_labels = None
depends_on = None


def upgrade():
    # Plain ADD COLUMN and CREATE INDEX, which SQLite does in place: a batch would copy events to a new
    # table and drop the old one, which the deliveries' foreign key to events refuses.
    op.add_column('events', sa.Column('resource_id', sa.String(length=200), nullable=True))
    op.create_index('ix_events_resource_id', 'events', ['resource_id'])
    op.create_index('ix_events_type_created_at', 'events', ['type', 'created_at'])
    # Events stored before this revision: their resource id, when data has a short string or number one.
    if op.get_bind().dialect.name == 'postgresql':
        op.execute("UPDATE events SET resource_id = data->>'resource_id' "
                   "WHERE json_typeof(data->'resource_id') IN ('string', 'number') "
                   "AND length(data->>'resource_id') <= 200")
    else:
        op.execute("UPDATE events SET resource_id = CAST(json_extract(data, '$.resource_id') AS TEXT) "
                   "WHERE json_type(data, '$.resource_id') IN ('text', 'integer', 'real') "
                   "AND length(json_extract(data, '$.resource_id')) <= 200")
    op.add_column('users', sa.Column('active', sa.Boolean(), nullable=False, server_default=sa.true()))
    op.create_table(
        'outcome_hours',
        sa.Column('subscription_id', sa.String(length=40), nullable=False),
        sa.Column('hour', sa.DateTime(), nullable=False),
        sa.Column('succeeded', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('failed', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('dead', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('duration_ms', sa.BigInteger(), nullable=False, server_default='0'),
        sa.PrimaryKeyConstraint('subscription_id', 'hour'),
    )


def downgrade():
    op.drop_table('outcome_hours')
    op.drop_index('ix_events_type_created_at', table_name='events')
    op.drop_index('ix_events_resource_id', table_name='events')
    # In place on SQLite too (3.35+): a batch would copy and drop events, which the deliveries' foreign key refuses.
    op.execute('ALTER TABLE users DROP COLUMN active')
    op.execute('ALTER TABLE events DROP COLUMN resource_id')
