-- The one-commit floor: the reservation inside the business transaction (one commit). Duplicates then wait on
-- the uncommitted key row instead of seeing 'in_progress'; see docs/benchmarks.md.
\set n random(1, 2000000000)
BEGIN;
INSERT INTO idempotency_keys AS k (scope, operation, key, fingerprint, status, lock_token, locked_until, request_headers, attempts, created_at, updated_at, expires_at) VALUES ('bench', 'POST /ledger', ('g-' || :n || '-' || :client_id), repeat('f', 64), 'in_progress', gen_random_uuid(), now() + interval '30 seconds', NULL, 1, now(), now(), now() + interval '1 day') ON CONFLICT (scope, operation, key) DO UPDATE SET status = 'in_progress', lock_token = excluded.lock_token, locked_until = excluded.locked_until, updated_at = now() WHERE k.expires_at <= now() OR (k.fingerprint = excluded.fingerprint AND (k.status = 'failed_retryable' OR (k.status = 'in_progress' AND k.locked_until <= now()))) RETURNING k.attempts;
INSERT INTO ledger (request_key, account, amount) VALUES (('g-' || :n || '-' || :client_id), 'acct-42', 1250) RETURNING id;
UPDATE idempotency_keys SET status = 'succeeded', response_status = 201, response_headers = '{"content-type":"application/json"}', response_body = convert_to('{"id":"1","account":"acct-42","amount":1250}', 'UTF8'), locked_until = NULL, updated_at = now() WHERE scope = 'bench' AND operation = 'POST /ledger' AND key = ('g-' || :n || '-' || :client_id) AND status = 'in_progress';
COMMIT;
