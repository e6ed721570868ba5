// The SQL of migrations/*.sql, embedded so that bundled and CJS builds need no file system access. A test checks
// that this matches the files byte for byte; edit the .sql file and paste it here.

/** A migration template before the schema and table names are filled in. */
export interface MigrationTemplate {
  id: number
  name: string
  sql: string
}

export const MIGRATION_TEMPLATES: readonly MigrationTemplate[] = [
  {
    id: 1,
    name: '001_create_idempotency_keys',
    sql: `-- oncely: the idempotency key record. One row per (scope, operation, key).
-- {{schema}}, {{table}} and {{expires_index}} are replaced with quoted identifiers by migrate() and renderMigrations().
CREATE TABLE IF NOT EXISTS {{schema}}.{{table}} (
  scope            text        NOT NULL,
  operation        text        NOT NULL,
  key              text        NOT NULL CHECK (char_length(key) BETWEEN 1 AND 255),
  fingerprint      text        NOT NULL,
  status           text        NOT NULL
                   CHECK (status IN ('in_progress', 'succeeded', 'failed_retryable', 'failed_permanent')),
  lock_token       uuid,
  locked_until     timestamptz,
  request_headers  jsonb,
  response_status  integer,
  response_headers jsonb,
  response_body    bytea,
  recovery_point   text,
  attempts         integer     NOT NULL DEFAULT 1,
  created_at       timestamptz NOT NULL DEFAULT now(),
  updated_at       timestamptz NOT NULL DEFAULT now(),
  expires_at       timestamptz NOT NULL,
  PRIMARY KEY (scope, operation, key)
);

-- The reaper deletes by expiry in bounded batches.
CREATE INDEX IF NOT EXISTS {{expires_index}} ON {{schema}}.{{table}} (expires_at);
`,
  },
  {
    id: 2,
    name: '002_create_outbox',
    sql: `-- oncely: the transactional outbox. enqueue() inserts a row in the business transaction; dispatchers publish it.
-- {{schema}} is replaced with a quoted identifier by migrate() and renderMigrations().
CREATE TABLE IF NOT EXISTS {{schema}}.outbox (
  id            uuid        PRIMARY KEY,
  seq           bigint      GENERATED ALWAYS AS IDENTITY UNIQUE,
  topic         text        NOT NULL CHECK (char_length(topic) > 0),
  aggregate_key text,
  payload       jsonb       NOT NULL,
  headers       jsonb       NOT NULL DEFAULT '{}',
  status        text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'published', 'dead')),
  attempts      integer     NOT NULL DEFAULT 0,
  claim_token   uuid,
  claimed_until timestamptz,
  available_at  timestamptz NOT NULL DEFAULT now(),
  last_error    text,
  created_at    timestamptz NOT NULL DEFAULT now(),
  published_at  timestamptz
);

-- Dispatchers scan pending rows in order; the aggregate index answers "is an earlier message still pending?".
CREATE INDEX IF NOT EXISTS outbox_pending_idx ON {{schema}}.outbox (seq) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS outbox_aggregate_idx ON {{schema}}.outbox (aggregate_key, seq)
  WHERE status = 'pending' AND aggregate_key IS NOT NULL;
-- The cleanup deletes published rows by age.
CREATE INDEX IF NOT EXISTS outbox_published_idx ON {{schema}}.outbox (published_at) WHERE status = 'published';
`,
  },
  {
    id: 3,
    name: '003_outbox_scope',
    sql: `-- oncely: the outbox records the tenant ("scope", as in the key record) and carries it in its unique keys, so the
-- outbox can be spread over several Postgres nodes by tenant (on Citus: distribute() in @oncely/server) next to the
-- tenant's key records and business rows: a distributed table's unique keys must contain its distribution column.
-- Rows written before this migration have the empty scope. Safe to run again (a second key table in the same schema
-- runs it too).
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
`,
  },
  {
    id: 4,
    name: '004_outbox_claimed_by',
    sql: `-- oncely: an outbox claim names the dispatcher that made it, by the key of a session-level advisory lock the
-- dispatcher holds on its LISTEN connection while it runs. When that lock is gone (the process crashed, its
-- connection closed), the claim is free at once instead of when its lease runs out. NULL: a claim made without such
-- a lock (no LISTEN, behind a transaction-mode pooler, on a distributed outbox), freed by its lease alone.
-- {{schema}} is replaced with a quoted identifier by migrate() and renderMigrations().
ALTER TABLE {{schema}}.outbox ADD COLUMN IF NOT EXISTS claimed_by bigint;
`,
  },
]
