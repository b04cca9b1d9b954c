"""users: session_version, so that signing out ends the session on the server

Revision ID: c41d7e9a0b52
Revises: b3e8d1f0a6c2
Create Date: 2026-11-30 12:20:00.000000

The session cookie is signed but kept by the browser; a copy would outlive a sign-out. The
session id Flask-Login stores is now "<user id>:<session_version>", and signing out raises the
version, so every earlier cookie stops resolving to a user.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'c41d7e9a0b52'
down_revision = 'b3e8d1f0a6c2'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("session_version", sa.Integer(), nullable=False, server_default=sa.text("0")))


def downgrade():
    with op.batch_alter_table("users") as batch:
        batch.drop_column("session_version")
