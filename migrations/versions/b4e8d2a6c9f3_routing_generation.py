"""routing generation: one number that changes with every committed change to what routes an event (PostgreSQL)

Revision ID: b4e8d2a6c9f3
Revises: f2c6a8d1e4b7
Create Date: 2026-12-01 19:30:00.000000

A web process keeps what the routing read returned (the token's team, the subscriptions that may want a
type, its declaration) with the generation it was read at, and its write stores the event only while the
generation is still that one (`dashboard.ingest.routing_cache`). Any change to subscriptions, tokens, event
types or teams moves the generation on in the same transaction, so the write sees the change exactly
when it would have seen the rows themselves.

The generation is moved at commit (deferred constraint triggers), once per transaction: its row is
locked only while committing, after every other row the transaction writes, so two transactions can
never wait on each other through it. TRUNCATE (which row triggers do not see) moves it at once. It
starts at a random number, so that a number kept from another database never matches this one.
"""
from alembic import op


# revision identifiers, used by Alembic.
revision = 'b4e8d2a6c9f3'
down_revision = 'f2c6a8d1e4b7'
branch_labels = None
depends_on = None

ROUTING_TABLES = ("subscriptions", "api_tokens", "event_types", "teams")


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("CREATE TABLE promesa_routing_generation (one boolean PRIMARY KEY DEFAULT true CHECK (one), "
               "generation bigint NOT NULL)")
    op.execute("INSERT INTO promesa_routing_generation (generation) VALUES (floor(random() * 1e15)::bigint)")
    op.execute("""
        CREATE FUNCTION promesa_routing_changed() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          -- Row triggers fire once per row written: move the generation once per transaction.
          IF TG_LEVEL = 'STATEMENT' OR current_setting('promesa.routing_changed', true) IS DISTINCT FROM 'yes' THEN
            UPDATE promesa_routing_generation SET generation = generation + 1;
            PERFORM set_config('promesa.routing_changed', 'yes', true);
          END IF;
          RETURN NULL;
        END $$""")
    for table in ROUTING_TABLES:
        op.execute(f"CREATE CONSTRAINT TRIGGER routing_changed AFTER INSERT OR UPDATE OR DELETE ON {table} "
                   "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION promesa_routing_changed()")
        op.execute(f"CREATE TRIGGER routing_truncated AFTER TRUNCATE ON {table} "
                   "FOR EACH STATEMENT EXECUTE FUNCTION promesa_routing_changed()")


def downgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in ROUTING_TABLES:
        op.execute(f"DROP TRIGGER routing_truncated ON {table}")
        op.execute(f"DROP TRIGGER routing_changed ON {table}")
    op.execute("DROP FUNCTION promesa_routing_changed()")
    op.execute("DROP TABLE promesa_routing_generation")
