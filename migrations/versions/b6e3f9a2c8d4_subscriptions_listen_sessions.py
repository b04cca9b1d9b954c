"""subscriptions: a listen session's last pull (issue 40, `promesa-receiver listen`)

Revision ID: b6e3f9a2c8d4
Revises: a7d2e9c4f1b8
Create Date: 2026-12-07 10:00:00.000000

listen_seen_at: set on a pull subscription that `promesa-receiver listen` created as a temporary session, to
when its client last pulled (at most once every few seconds); the sweeper deletes a session idle longer than
PROMESA_LISTEN_IDLE_SECONDS. NULL on every other subscription: every existing row stays what it was.
The partial index holds the sessions not yet deleted: the sweeper's pass reads those alone.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'b6e3f9a2c8d4'
down_revision = 'a7d2e9c4f1b8'
branch_labels = None
depends_on = None

LIVE_SESSIONS = sa.text("listen_seen_at IS NOT NULL AND deleted_at IS NULL")


def upgrade():
    # A nullable column without a default: a plain ADD COLUMN on SQLite too (a batch would copy the table
    # under its foreign keys).
    op.add_column('subscriptions', sa.Column('listen_seen_at', sa.DateTime(), nullable=True))
    op.create_index('ix_subscriptions_listen_seen_at', 'subscriptions', ['listen_seen_at'],
                    postgresql_where=LIVE_SESSIONS, sqlite_where=LIVE_SESSIONS)


def downgrade():
    op.drop_index('ix_subscriptions_listen_seen_at', table_name='subscriptions')
    op.drop_column('subscriptions', 'listen_seen_at')  # in place on SQLite 3.35 and later
