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
    with op.batch_alter_table('events') as batch:
        batch.add_column(sa.Column('resource_id', sa.String(length=200), nullable=True))
        batch.create_index('ix_events_resource_id', ['resource_id'])
        batch.create_index('ix_events_type_created_at', ['type', 'created_at'])
    # Events stored before this revision: their resource id, when data has a short string or number one.
    if op.get_bind().dialect.name == 'postgresql':
        op.execute("UPDATE events SET resource_id = data->>'resource_id' "
                   "WHERE json_typeof(data->'resource_id') IN ('string', 'number') "
                   "AND length(data->>'resource_id') <= 200")
    else:
        op.execute("UPDATE events SET resource_id = CAST(json_extract(data, '$.resource_id') AS TEXT) "
                   "WHERE json_type(data, '$.resource_id') IN ('text', 'integer', 'real') "
                   "AND length(json_extract(data, '$.resource_id')) <= 200")
    with op.batch_alter_table('users') as batch:
        batch.add_column(sa.Column('active', sa.Boolean(), nullable=False, server_default=sa.true()))
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
    with op.batch_alter_table('users') as batch:
        batch.drop_column('active')
    with op.batch_alter_table('events') as batch:
        batch.drop_index('ix_events_type_created_at')
        batch.drop_index('ix_events_resource_id')
        batch.drop_column('resource_id')
