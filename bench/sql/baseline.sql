-- The business transaction alone (what the baseline variant sends).
\set n random(1, 2000000000)
BEGIN;
INSERT INTO ledger (request_key, account, amount) VALUES ('b-' || :n || '-' || :client_id, 'acct-42', 1250) RETURNING id;
COMMIT;
