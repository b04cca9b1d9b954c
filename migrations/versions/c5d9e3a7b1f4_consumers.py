"""consumers: the parties a team's events are addressed to, their subscriptions, and the events addressed to them

Revision ID: c5d9e3a7b1f4
Revises: b9d3f5a7c1e2
Create Date: 2026-12-06 08:00:00.000000

Existing subscriptions and events belong to no consumer (consumer_id NULL): they route exactly as before.

On PostgreSQL the route keys gain the consumer: "<team> <type>" for a subscription of no consumer (as
before), "<team>.<consumer> <type>" for a consumer's. An unaddressed event's read never sees a consumer's
subscriptions, and an addressed one's sees only that consumer's, however many consumers the team has.
The consumers table joins the routing generation's tables: disabling or deleting one changes routing.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'c5d9e3a7b1f4'
down_revision = 'b9d3f5a7c1e2'
branch_labels = None
depends_on = None

LIVE = sa.text('deleted_at IS NULL')
ADDRESSED = sa.text('consumer_id IS NOT NULL')

# IMMUTABLE (so it can be stored and indexed): it reads only its arguments. A list that is not an array has no keys.
_FUNCTION = r"""
CREATE FUNCTION promesa_consumer_route_keys(team integer, consumer integer, types json) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT CASE WHEN json_typeof(types) = 'array' THEN
    ARRAY(SELECT team::text || coalesce('.' || consumer::text, '') || ' '
                 || CASE WHEN entry ~ '[*?[]' THEN '*' ELSE entry END
          FROM json_array_elements_text(types) AS entry)
  END
$$
"""
# As in f2c6a8d1e4b7: fastupdate off, so new entries go into the index at once.
_INDEX = ("CREATE INDEX ix_subscriptions_route_keys ON subscriptions USING gin (route_keys) WITH (fastupdate = off) "
          "WHERE deleted_at IS NULL")


def upgrade():
    postgresql = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        'consumers',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('team_id', sa.Integer(), sa.ForeignKey('teams.id'), nullable=False),
        sa.Column('uid', sa.String(length=100).with_variant(sa.String(length=100, collation='C'), 'postgresql'),
                  nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('metadata', sa.JSON(), nullable=True),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('state_reason', sa.String(length=500), nullable=True),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('updated_at', sa.DateTime(), nullable=False),
        sa.Column('deleted_at', sa.DateTime(), nullable=True),
    )
    op.create_index('uq_consumers_team_uid', 'consumers', ['team_id', 'uid'], unique=True,
                    postgresql_where=LIVE, sqlite_where=LIVE)
    op.add_column('subscriptions', sa.Column('consumer_id', sa.Integer(), nullable=True))
    if postgresql:  # SQLite cannot add a constraint to a table in place
        op.create_foreign_key('fk_subscriptions_consumer_id', 'subscriptions', 'consumers', ['consumer_id'], ['id'])
    op.create_index('ix_subscriptions_team_consumer', 'subscriptions', ['team_id', 'consumer_id'])
    op.create_index('ix_subscriptions_consumer_id', 'subscriptions', ['consumer_id'],
                    postgresql_where=ADDRESSED, sqlite_where=ADDRESSED)
    op.add_column('events', sa.Column('consumer_id', sa.Integer(), nullable=True))
    op.create_index('ix_events_consumer_created_at', 'events', ['consumer_id', 'created_at'],
                    postgresql_where=ADDRESSED, sqlite_where=ADDRESSED)
    if not postgresql:
        return
    op.execute(_FUNCTION)
    op.execute("DROP INDEX ix_subscriptions_route_keys")
    op.execute("ALTER TABLE subscriptions DROP COLUMN route_keys")
    op.execute("ALTER TABLE subscriptions ADD COLUMN route_keys text[] "
               "GENERATED ALWAYS AS (promesa_consumer_route_keys(team_id, consumer_id, event_types)) STORED")
    op.execute(_INDEX)
    op.execute("CREATE CONSTRAINT TRIGGER routing_changed AFTER INSERT OR UPDATE OR DELETE ON consumers "
               "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION promesa_routing_changed()")
    op.execute("CREATE TRIGGER routing_truncated AFTER TRUNCATE ON consumers "
               "FOR EACH STATEMENT EXECUTE FUNCTION promesa_routing_changed()")


def downgrade():
    postgresql = op.get_bind().dialect.name == "postgresql"
    if postgresql:
        op.execute("DROP TRIGGER routing_truncated ON consumers")
        op.execute("DROP TRIGGER routing_changed ON consumers")
        op.execute("DROP INDEX ix_subscriptions_route_keys")
        op.execute("ALTER TABLE subscriptions DROP COLUMN route_keys")
        op.execute("ALTER TABLE subscriptions ADD COLUMN route_keys text[] "
                   "GENERATED ALWAYS AS (promesa_route_keys(team_id, event_types)) STORED")
        op.execute(_INDEX)
        op.execute("DROP FUNCTION promesa_consumer_route_keys(integer, integer, json)")
    op.drop_index('ix_events_consumer_created_at', table_name='events')
    op.drop_column('events', 'consumer_id')
    op.drop_index('ix_subscriptions_consumer_id', table_name='subscriptions')
    op.drop_index('ix_subscriptions_team_consumer', table_name='subscriptions')
    if postgresql:
        op.drop_constraint('fk_subscriptions_consumer_id', 'subscriptions', type_='foreignkey')
    # SQLite drops the column in place (3.35 and later); a batch would copy the table under its foreign keys.
    op.execute("ALTER TABLE subscriptions DROP COLUMN consumer_id")
    op.drop_index('uq_consumers_team_uid', table_name='consumers')
    op.drop_table('consumers')
