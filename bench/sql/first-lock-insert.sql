-- A candidate design: a transaction-scoped advisory lock on the key (the prompt 409 for a concurrent duplicate) and
-- the lookup in the BEGIN's round trip, then the business write, then the finished key record as one INSERT: one
-- commit, one extra statement, and one key-row version instead of an insert and an update.
\set n random(1, 2000000000)
BEGIN;
SELECT pg_try_advisory_xact_lock(hashtextextended('bench' || 'POST /ledger' || ('l-' || :n || '-' || :client_id), 0)) AS locked, (SELECT status FROM idempotency_keys WHERE scope = 'bench' AND operation = 'POST /ledger' AND key = ('l-' || :n || '-' || :client_id)) AS status;
INSERT INTO ledger (request_key, account, amount) VALUES (('l-' || :n || '-' || :client_id), 'acct-42', 1250) RETURNING id;
INSERT INTO idempotency_keys AS k (scope, operation, key, fingerprint, status, lock_token, locked_until, request_headers, attempts, created_at, updated_at, expires_at, response_status, response_headers, response_body) VALUES ('bench', 'POST /ledger', ('l-' || :n || '-' || :client_id), repeat('f', 64), 'succeeded', NULL, NULL, NULL, 1, now(), now(), now() + interval '1 day', 201, '{"content-type":"application/json"}', convert_to('{"id":"1","account":"acct-42","amount":1250}', 'UTF8')) ON CONFLICT (scope, operation, key) DO UPDATE SET status = excluded.status, response_status = excluded.response_status, response_headers = excluded.response_headers, response_body = excluded.response_body WHERE k.expires_at <= now() OR k.status = 'failed_retryable';
COMMIT;
