-- The simulated provider's ledger. It lives in the demo's database for convenience, but it is written on the
-- provider's own connection, never inside the API's transaction, so a rolled-back request keeps its charge, as a
-- real external provider would.
CREATE TABLE provider_charges (
  step_key text PRIMARY KEY,
  charge_id text NOT NULL UNIQUE,
  tenant_id text NOT NULL,
  amount bigint NOT NULL,
  currency text NOT NULL,
  status text NOT NULL CHECK (status IN ('succeeded', 'declined')),
  created_at timestamptz NOT NULL DEFAULT now()
);
