-- oncely: the key table's two CHECK constraints go. Postgres evaluated them on every insert of a key record; the
-- engine checks the same before it writes anything (a key of 1 to 255 characters, and only its own four statuses:
-- 'in_progress', 'succeeded', 'failed_retryable', 'failed_permanent'), so they only cost time.
-- {{schema}}, {{table}}, {{key_check}} and {{status_check}} are replaced with quoted identifiers by migrate() and
-- renderMigrations(); the last two are the names Postgres gave the constraints of 001.
ALTER TABLE {{schema}}.{{table}} DROP CONSTRAINT IF EXISTS {{key_check}};
ALTER TABLE {{schema}}.{{table}} DROP CONSTRAINT IF EXISTS {{status_check}};
