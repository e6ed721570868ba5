-- oncely: the outbox records the tenant ("scope", as in the key record) and carries it in its unique keys, so the
-- outbox can be spread over several Postgres nodes by tenant (on Citus: distribute() in @oncely/server) next to the
-- tenant's key records and business rows: a distributed table's unique keys must contain its distribution column.
-- Rows written before this migration have the empty scope. Safe to run again (versions before migration 005 ran
-- it once per key table of the schema).
-- {{schema}} is replaced with a quoted identifier by migrate() and renderMigrations().
ALTER TABLE {{schema}}.outbox ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT '';
CREATE UNIQUE INDEX IF NOT EXISTS outbox_scope_id_key ON {{schema}}.outbox (scope, id);
CREATE UNIQUE INDEX IF NOT EXISTS outbox_scope_seq_key ON {{schema}}.outbox (scope, seq);
ALTER TABLE {{schema}}.outbox DROP CONSTRAINT IF EXISTS outbox_pkey;
ALTER TABLE {{schema}}.outbox DROP CONSTRAINT IF EXISTS outbox_seq_key;
-- What identifies a row to logical replication, which Citus uses to move shards between nodes.
ALTER TABLE {{schema}}.outbox REPLICA IDENTITY USING INDEX outbox_scope_id_key;
-- requeueDead() finds dead-lettered rows by id alone.
CREATE INDEX IF NOT EXISTS outbox_dead_idx ON {{schema}}.outbox (id) WHERE status = 'dead';
