"""consumer portal: the links producers hand their consumers, the sessions they open, and each team's portal look

Revision ID: a3e7c9f1b5d2
Revises: c5d9e3a7b1f4
Create Date: 2026-12-06 11:00:00.000000

A link and the session it opens are one row: a link opens at most one session, which ends when the link
would have expired. Only SHA-256 hashes of the random tokens are stored.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'a3e7c9f1b5d2'
down_revision = 'c5d9e3a7b1f4'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'portal_links',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('team_id', sa.Integer(), nullable=False),
        sa.Column('consumer_id', sa.Integer(), nullable=False),
        sa.Column('token_hash', sa.String(length=64), nullable=False),
        sa.Column('session_hash', sa.String(length=64), nullable=True),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('created_by', sa.String(length=254), nullable=False),
        sa.Column('expires_at', sa.DateTime(), nullable=False),
        sa.Column('opened_at', sa.DateTime(), nullable=True),
        sa.Column('revoked_at', sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(['consumer_id'], ['consumers.id']),
        sa.ForeignKeyConstraint(['team_id'], ['teams.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('token_hash'),
        sa.UniqueConstraint('session_hash'),
    )
    op.create_index('ix_portal_links_consumer', 'portal_links', ['consumer_id'])
    op.add_column('teams', sa.Column('portal_frame_ancestors', sa.JSON(), nullable=True))
    op.add_column('teams', sa.Column('portal_accent', sa.String(length=7), nullable=True))
    op.add_column('teams', sa.Column('portal_logo_url', sa.String(length=500), nullable=True))


def downgrade():
    # SQLite drops a column in place (3.35 and later); a batch would copy teams under the foreign keys to it.
    for column in ('portal_logo_url', 'portal_accent', 'portal_frame_ancestors'):
        op.execute(f"ALTER TABLE teams DROP COLUMN {column}")
    op.drop_index('ix_portal_links_consumer', table_name='portal_links')
    op.drop_table('portal_links')
