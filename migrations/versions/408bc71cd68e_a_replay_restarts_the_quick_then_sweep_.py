"""a replay restarts the quick-then-sweep age

Revision ID: 408bc71cd68e
Revises: 788df9a21fe2
Create Date: 2026-11-29 20:27:33.454069

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '408bc71cd68e'
down_revision = '788df9a21fe2'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('deliveries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('schedule_started_at', sa.DateTime(), nullable=True))



def downgrade():
    with op.batch_alter_table('deliveries', schema=None) as batch_op:
        batch_op.drop_column('schedule_started_at')

