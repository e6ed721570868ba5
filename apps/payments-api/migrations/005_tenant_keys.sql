-- The tenant in every unique key, so the tables can be distributed by tenant (DATABASE_DISTRIBUTION=citus): a
-- distributed table's unique keys must contain its distribution column, since a shard enforces uniqueness among its
-- own rows only. On one Postgres they are the same keys with the tenant in front. The outbox records the tenant of
-- its payment; rows written before get it from their payment.
ALTER TABLE payments DROP CONSTRAINT payments_pkey, ADD CONSTRAINT payments_pkey PRIMARY KEY (tenant_id, id);
ALTER TABLE outbox ADD COLUMN tenant_id text;
UPDATE outbox SET tenant_id = p.tenant_id FROM payments p WHERE p.id::text = outbox.aggregate_id;
UPDATE outbox SET tenant_id = '' WHERE tenant_id IS NULL;
ALTER TABLE outbox ALTER COLUMN tenant_id SET NOT NULL;
ALTER TABLE outbox DROP CONSTRAINT outbox_pkey, ADD CONSTRAINT outbox_pkey PRIMARY KEY (tenant_id, id);
