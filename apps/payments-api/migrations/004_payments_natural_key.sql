-- The ledger's natural key: one payment per tenant and provider charge. An idempotency key is only remembered for
-- its retention; a retry that arrives after that is a new request to the API, but its charge step sends the same
-- step key, so the provider answers with the charge it already took, and this constraint then finds the payment
-- already recorded for it (`insertOrExisting` in src/ledger.ts) instead of booking a second one.
--
-- A database written before this constraint may already hold such duplicates. Nothing here picks which row of a
-- ledger to drop: the migration stops and says how to find them.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM payments GROUP BY tenant_id, charge_id HAVING count(*) > 1) THEN
    RAISE EXCEPTION 'payments has more than one row for some provider charge; keep one per (tenant_id, charge_id), then start again'
      USING HINT = 'SELECT tenant_id, charge_id, array_agg(id ORDER BY created_at) FROM payments GROUP BY 1, 2 HAVING count(*) > 1';
  END IF;
END $$;
ALTER TABLE payments ADD CONSTRAINT payments_tenant_charge_key UNIQUE (tenant_id, charge_id);
