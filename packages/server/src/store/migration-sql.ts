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
]
