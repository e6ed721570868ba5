-- Schema for the statement-cost experiments (pgbench scripts in this folder): the bench ledger and a copy of
-- oncely's key table (packages/server/migrations/001), pre-filled with 100,000 finished keys for the replay scripts.
DROP TABLE IF EXISTS ledger, idempotency_keys;
CREATE TABLE ledger (
  id bigserial PRIMARY KEY, request_key text, account text NOT NULL, amount integer NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON ledger (request_key);
CREATE TABLE idempotency_keys (
  scope text NOT NULL, operation text NOT NULL,
  key text NOT NULL CHECK (char_length(key) BETWEEN 1 AND 255),
  fingerprint text NOT NULL,
  status text NOT NULL CHECK (status IN ('in_progress', 'succeeded', 'failed_retryable', 'failed_permanent')),
  lock_token uuid, locked_until timestamptz, request_headers jsonb, response_status integer,
  response_headers jsonb, response_body bytea, recovery_point text, attempts integer NOT NULL DEFAULT 1,
  created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (scope, operation, key)
);
CREATE INDEX ON idempotency_keys (expires_at);
INSERT INTO idempotency_keys (scope, operation, key, fingerprint, status, response_status, response_headers,
  response_body, expires_at)
SELECT 'bench', 'POST /ledger', 'replay-' || i, repeat('f', 64), 'succeeded', 201,
  '{"content-type":"application/json"}', convert_to('{"id":"1","account":"acct-42","amount":1250}', 'UTF8'),
  now() + interval '1 day'
FROM generate_series(1, 100000) AS i;
VACUUM ANALYZE;
