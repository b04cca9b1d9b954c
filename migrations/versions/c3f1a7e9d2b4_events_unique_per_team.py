"""events: a producer's event id is unique in its team, not across teams

Revision ID: c3f1a7e9d2b4
Revises: c7a4e9b2d5f1
Create Date: 2026-11-30 12:30:00.000000

One team could take an id another team would use (a 409) and learn that it exists. Events get
`key`, Promesa's own id for the row (unique everywhere, what deliveries reference: the id
Promesa generated, or a fresh one when the producer chose the id), and `id`, the id producers
and receivers see, becomes unique per (team_id, id).

Every existing id was unique across teams, so the old `id` column simply becomes `key` (renamed:
its primary key and the deliveries' foreign key follow, on both databases, without rebuilding a
table) and a new `id` column starts as a copy of it. ix_events_team_id goes: the new unique index
starts with team_id.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'c3f1a7e9d2b4'
down_revision = 'c7a4e9b2d5f1'
branch_labels = None
depends_on = None


def upgrade():
    postgresql = op.get_bind().dialect.name == "postgresql"
    op.execute('ALTER TABLE events RENAME COLUMN id TO "key"')
    op.execute("ALTER TABLE deliveries RENAME COLUMN event_id TO event_key")
    op.execute("ALTER INDEX ix_deliveries_event_id RENAME TO ix_deliveries_event_key" if postgresql else
               "DROP INDEX ix_deliveries_event_id")
    if postgresql:
        op.execute("ALTER TABLE deliveries RENAME CONSTRAINT deliveries_event_id_fkey TO deliveries_event_key_fkey")
        op.add_column("events", sa.Column("id", sa.String(64), nullable=True))
        op.execute('UPDATE events SET id = "key"')
        op.alter_column("events", "id", nullable=False)
        op.create_unique_constraint("uq_events_team_id", "events", ["team_id", "id"])
    else:
        # SQLite adds a NOT NULL column only with a default; every row gets its real value at once.
        op.execute("ALTER TABLE events ADD COLUMN id VARCHAR(64) NOT NULL DEFAULT ''")
        op.execute('UPDATE events SET id = "key"')
        op.create_index("ix_deliveries_event_key", "deliveries", ["event_key"])
        op.create_index("uq_events_team_id", "events", ["team_id", "id"], unique=True)
    op.drop_index("ix_events_team_id", table_name="events")


def downgrade():
    chosen = op.get_bind().scalar(sa.text('SELECT count(*) FROM events WHERE id <> "key"'))
    if chosen:
        raise RuntimeError(f"{chosen} events have an id their producer chose, which is unique only in its team: "
                           "the old schema cannot hold them")
    postgresql = op.get_bind().dialect.name == "postgresql"
    op.create_index("ix_events_team_id", "events", ["team_id"])
    if postgresql:
        op.drop_constraint("uq_events_team_id", "events", type_="unique")
        op.execute("ALTER TABLE deliveries RENAME CONSTRAINT deliveries_event_key_fkey TO deliveries_event_id_fkey")
        op.execute("ALTER INDEX ix_deliveries_event_key RENAME TO ix_deliveries_event_id")
    else:
        op.drop_index("uq_events_team_id", table_name="events")
        op.drop_index("ix_deliveries_event_key", table_name="deliveries")
    op.drop_column("events", "id")
    op.execute('ALTER TABLE events RENAME COLUMN "key" TO id')
    op.execute("ALTER TABLE deliveries RENAME COLUMN event_key TO event_id")
    if not postgresql:
        op.create_index("ix_deliveries_event_id", "deliveries", ["event_id"])
