"""subscriptions: OAuth2 client credentials and a client certificate, encrypted (issue 39)

Revision ID: f4c1a8e3b7d5
Revises: e2b7d4f9a1c6
Create Date: 2026-12-06 14:05:00.000000

auth_ciphertext: Fernet ciphertext of the OAuth2 client-credentials setting (JSON, client secret inside).
tls_ciphertext: Fernet ciphertext of the client certificate, its key and an extra CA bundle (JSON).
tls_subject, tls_issuer, tls_expires_at: what pages, the contract and the expiry rule show of the
certificate, in clear (a certificate is public; its key is not).
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'f4c1a8e3b7d5'
down_revision = 'e2b7d4f9a1c6'
branch_labels = None
depends_on = None


def upgrade():
    # Nullable columns without defaults: plain ADD COLUMNs on SQLite too (a batch would copy the table
    # under its foreign keys).
    op.add_column('subscriptions', sa.Column('auth_ciphertext', sa.Text(), nullable=True))
    op.add_column('subscriptions', sa.Column('tls_ciphertext', sa.Text(), nullable=True))
    op.add_column('subscriptions', sa.Column('tls_subject', sa.String(length=500), nullable=True))
    op.add_column('subscriptions', sa.Column('tls_issuer', sa.String(length=500), nullable=True))
    op.add_column('subscriptions', sa.Column('tls_expires_at', sa.DateTime(), nullable=True))


def downgrade():
    for column in ('tls_expires_at', 'tls_issuer', 'tls_subject', 'tls_ciphertext', 'auth_ciphertext'):
        op.drop_column('subscriptions', column)  # in place on SQLite 3.35 and later
