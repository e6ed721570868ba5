-- One row per accepted payment, written in the same transaction that completes the idempotency key.
-- `reference` is the merchant's own label and deliberately not unique: two payments may share one.
CREATE TABLE payments (
  id uuid PRIMARY KEY,
  tenant_id text NOT NULL,
  amount bigint NOT NULL CHECK (amount > 0),
  currency text NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
  reference text,
  charge_id text NOT NULL,
  idempotency_key text,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payments_tenant_created ON payments (tenant_id, created_at);
