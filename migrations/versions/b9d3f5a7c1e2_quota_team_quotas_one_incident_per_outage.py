"""team quota overrides; one unresolved incident per subscription, listing every rule that fired

Revision ID: b9d3f5a7c1e2
Revises: a9d3c5e7f1b2
Create Date: 2026-12-03 07:10:00.000000
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'b9d3f5a7c1e2'
down_revision = 'a9d3c5e7f1b2'  # after the receiver checks' migration
branch_labels = None
depends_on = None

UNRESOLVED = sa.text('resolved_at IS NULL')


def upgrade():
    op.create_table(
        'team_quotas',
        sa.Column('team_id', sa.Integer(), sa.ForeignKey('teams.id'), nullable=False),
        sa.Column('name', sa.String(length=40), nullable=False),
        sa.Column('value', sa.BigInteger(), nullable=False),
        sa.Column('updated_at', sa.DateTime(), nullable=False),
        sa.Column('updated_by', sa.String(length=254), nullable=False),
        sa.PrimaryKeyConstraint('team_id', 'name'),
    )
    op.add_column('incidents', sa.Column('rules', sa.JSON(), nullable=True))
    op.drop_index('uq_incidents_unresolved', table_name='incidents')
    # Of a subscription's unresolved incidents (one per rule until now) the oldest stays open; the others resolve.
    op.execute("UPDATE incidents SET state = 'resolved', resolved_at = last_seen_at WHERE resolved_at IS NULL "
               "AND id NOT IN (SELECT min(id) FROM incidents WHERE resolved_at IS NULL "
               "GROUP BY coalesce(subscription_id, ''))")
    op.create_index('uq_incidents_unresolved', 'incidents', [sa.text("coalesce(subscription_id, '')")],
                    unique=True, postgresql_where=UNRESOLVED, sqlite_where=UNRESOLVED)


def downgrade():
    op.drop_index('uq_incidents_unresolved', table_name='incidents')
    op.create_index('uq_incidents_unresolved', 'incidents', [sa.text("coalesce(subscription_id, '')"), 'rule'],
                    unique=True, postgresql_where=UNRESOLVED, sqlite_where=UNRESOLVED)
    op.drop_column('incidents', 'rules')
    op.drop_table('team_quotas')
