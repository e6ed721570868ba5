-- oncely: the transactional outbox. enqueue() inserts a row in the business transaction; dispatchers publish it.
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
