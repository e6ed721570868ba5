-- oncely: an outbox claim names the dispatcher that made it, by the key of a session-level advisory lock the
-- dispatcher holds on its LISTEN connection while it runs. When that lock is gone (the process crashed, its
-- connection closed), the claim is free at once instead of when its lease runs out. NULL: a claim made without such
-- a lock (no LISTEN, behind a transaction-mode pooler, on a distributed outbox), freed by its lease alone.
-- {{schema}} is replaced with a quoted identifier by migrate() and renderMigrations().
ALTER TABLE {{schema}}.outbox ADD COLUMN IF NOT EXISTS claimed_by bigint;
