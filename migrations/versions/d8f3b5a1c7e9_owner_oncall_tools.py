"""owner and on-call tools: named tokens with an expiry and their last use, named sinks with a filter,
and incidents acknowledged with a note, snoozed or resolved by hand

Revision ID: d8f3b5a1c7e9
Revises: b4e8d2a6c9f3
Create Date: 2026-12-03 07:00:00.000000

A token's last use lives in a table of its own: api_tokens is a routing table (b4e8d2a6c9f3), and a write
to it would move the routing generation, emptying every web process's kept routing once a minute.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'd8f3b5a1c7e9'
down_revision = 'b4e8d2a6c9f3'
branch_labels = None
depends_on = None


def upgrade():
    # Plain ADD COLUMN (no batch): SQLite would otherwise copy tables other rows refer to.
    op.add_column('api_tokens', sa.Column('name', sa.String(100), nullable=False, server_default=''))
    op.add_column('api_tokens', sa.Column('created_by', sa.String(254), nullable=True))
    op.add_column('api_tokens', sa.Column('expires_at', sa.DateTime(), nullable=True))
    op.create_table('api_token_uses',
                    sa.Column('token_id', sa.Integer(), sa.ForeignKey('api_tokens.id'), primary_key=True),
                    sa.Column('last_used_at', sa.DateTime(), nullable=False))
    op.add_column('notification_sinks', sa.Column('name', sa.String(100), nullable=False, server_default=''))
    op.add_column('notification_sinks', sa.Column('team_ids', sa.JSON(), nullable=True))
    op.add_column('notification_sinks', sa.Column('kinds', sa.JSON(), nullable=True))
    op.add_column('incidents', sa.Column('acknowledged_note', sa.String(500), nullable=True))
    op.add_column('incidents', sa.Column('snoozed_until', sa.DateTime(), nullable=True))
    op.add_column('incidents', sa.Column('snoozed_by', sa.String(254), nullable=True))
    op.add_column('incidents', sa.Column('resolved_by', sa.String(254), nullable=True))


def downgrade():
    for column in ('resolved_by', 'snoozed_by', 'snoozed_until', 'acknowledged_note'):
        op.drop_column('incidents', column)
    for column in ('kinds', 'team_ids', 'name'):
        op.drop_column('notification_sinks', column)
    op.drop_table('api_token_uses')
    for column in ('expires_at', 'created_by', 'name'):
        op.drop_column('api_tokens', column)
