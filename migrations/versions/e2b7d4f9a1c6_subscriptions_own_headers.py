"""subscriptions: the receiver's own headers, encrypted (issue 39)

Revision ID: e2b7d4f9a1c6
Revises: d2f8b4c6e1a9
Create Date: 2026-12-06 11:45:00.000000

One nullable column: Fernet ciphertext of a JSON object {name: value}, as secrets are kept; the names
are inside it too, so the column says nothing about the receiver's gateway.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'e2b7d4f9a1c6'
down_revision = 'd2f8b4c6e1a9'
branch_labels = None
depends_on = None


def upgrade():
    # A nullable column without a default: a plain ADD COLUMN on SQLite too (a batch would copy the table
    # under its foreign keys).
    op.add_column('subscriptions', sa.Column('headers_ciphertext', sa.Text(), nullable=True))


def downgrade():
    op.drop_column('subscriptions', 'headers_ciphertext')  # in place on SQLite 3.35 and later
