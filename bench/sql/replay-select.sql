-- A read-only replay: the lookup alone (no row lock, no WAL, no commit flush).
\set n random(1, 100000)
SELECT fingerprint, status, expires_at <= now() AS expired, response_status, response_headers, response_body FROM idempotency_keys WHERE scope = 'bench' AND operation = 'POST /ledger' AND key = ('replay-' || :n);
