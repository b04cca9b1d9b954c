"""subscription payload filter: only the events a subscription's filter admits get a delivery

Revision ID: d2f8b4c6e1a9
Revises: a3e7c9f1b5d2
Create Date: 2026-12-06 12:00:00.000000

A nullable JSON column (NULL: no filter). Writing it moves the routing generation like any other change
to a subscription row (migration b4e8d2a6c9f3's trigger is on the table), so a web process's kept routing,
and the filters compiled with it, are read again after an edit.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'd2f8b4c6e1a9'
down_revision = 'a3e7c9f1b5d2'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('subscriptions', sa.Column('filter', sa.JSON(none_as_null=True), nullable=True))


def downgrade():
    # SQLite drops the column in place (3.35 and later); a batch would copy the table under its foreign keys.
    op.drop_column('subscriptions', 'filter')
