"""event type catalog, strict mode, per-subscription versions

Revision ID: 788df9a21fe2
Revises: 78fc5f48959f
Create Date: 2026-11-29 19:12:00.303181

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '788df9a21fe2'
down_revision = '78fc5f48959f'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('event_types',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('team_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('description', sa.String(length=1000), nullable=False),
    sa.Column('schema', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['team_id'], ['teams.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('team_id', 'name', 'version', name='uq_event_types_team_name_version')
    )
    with op.batch_alter_table('subscriptions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('event_versions', sa.JSON(), nullable=False, server_default='{}'))

    with op.batch_alter_table('teams', schema=None) as batch_op:
        batch_op.add_column(sa.Column('strict_event_types', sa.Boolean(), nullable=False, server_default=sa.false()))



def downgrade():
    with op.batch_alter_table('teams', schema=None) as batch_op:
        batch_op.drop_column('strict_event_types')

    with op.batch_alter_table('subscriptions', schema=None) as batch_op:
        batch_op.drop_column('event_versions')

    op.drop_table('event_types')
