import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { readFinalDb } from '../src/snapshot.js'

// The columns the suite reads, as the demo's migrations and @oncely/server's key table define them.
const SCHEMA = `
  CREATE TABLE payments (id uuid PRIMARY KEY, tenant_id text NOT NULL, amount bigint NOT NULL, currency text NOT NULL,
    reference text, charge_id text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
  CREATE TABLE provider_charges (step_key text PRIMARY KEY, charge_id text NOT NULL UNIQUE, tenant_id text NOT NULL,
    amount bigint NOT NULL, currency text NOT NULL, status text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
  CREATE TABLE outbox (id uuid PRIMARY KEY, topic text NOT NULL, aggregate_id text NOT NULL, payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now());
  CREATE SCHEMA oncely;
  CREATE TABLE oncely.idempotency_keys (scope text NOT NULL, operation text NOT NULL, key text NOT NULL,
    status text NOT NULL, response_status integer, response_body bytea, created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, operation, key));
`

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('chaos_snapshot')
  await db.pool.query(SCHEMA)
})
afterAll(() => db?.drop())

describe('readFinalDb', () => {
  it('reads payments, attributes charges through their payment, and parses stored JSON responses', async () => {
    const p1 = '00000000-0000-4000-8000-000000000001'
    const p2 = '00000000-0000-4000-8000-000000000002'
    const body = JSON.stringify({ id: p1, amount: 100 })
    await db.pool.query(
      `INSERT INTO payments (id, tenant_id, amount, currency, reference, charge_id, created_at)
       VALUES ($1, 't1', 100, 'eur', 'i1', 'ch_1', now()), ($2, 't1', 100, 'eur', 'i1', 'ch_1', now() + interval '1s')`,
      [p1, p2],
    )
    await db.pool.query(
      `INSERT INTO provider_charges (step_key, charge_id, tenant_id, amount, currency, status)
       VALUES ('s1', 'ch_1', 't1', 100, 'eur', 'succeeded'), ('s2', 'ch_2', 't1', 3000000, 'eur', 'declined')`,
    )
    await db.pool.query(
      `INSERT INTO outbox (id, topic, aggregate_id, payload)
       VALUES ('00000000-0000-4000-8000-0000000000a1', 'payment.created', $1, '{}')`,
      [p1],
    )
    await db.pool.query(
      `INSERT INTO oncely.idempotency_keys VALUES
         ('t1', 'POST /v1/payments', 'k1', 'succeeded', 201, $1, '2026-12-07T07:14:12.150Z'),
         ('t1', 'POST /v1/payments', 'k2', 'in_progress', NULL, NULL, '2026-12-07T07:14:12.990Z')`,
      [Buffer.from(body)],
    )
    const snapshot = await readFinalDb(db.pool)
    expect(snapshot.payments).toEqual([
      { id: p1, tenantId: 't1', amount: 100, currency: 'eur', reference: 'i1', chargeId: 'ch_1' },
      { id: p2, tenantId: 't1', amount: 100, currency: 'eur', reference: 'i1', chargeId: 'ch_1' },
    ])
    // Two payments share one charge (idempotency off): still one charge row, attributed to the intent.
    expect(snapshot.charges).toEqual([
      { id: 'ch_1', tenantId: 't1', amount: 100, currency: 'eur', reference: 'i1', status: 'succeeded' },
      { id: 'ch_2', tenantId: 't1', amount: 3_000_000, currency: 'eur', reference: null, status: 'declined' },
    ])
    expect(snapshot.keys).toEqual([
      {
        tenantId: 't1',
        key: 'k1',
        state: 'succeeded',
        responseStatus: 201,
        responseBody: { id: p1, amount: 100 },
        // When the row's transaction began, in milliseconds: the checker times a changed-payload probe's row by it.
        createdAt: Date.parse('2026-12-07T07:14:12.150Z'),
      },
      {
        tenantId: 't1',
        key: 'k2',
        state: 'in_progress',
        responseStatus: null,
        responseBody: null,
        createdAt: Date.parse('2026-12-07T07:14:12.990Z'),
      },
    ])
    expect(snapshot.outbox).toEqual([{ id: '00000000-0000-4000-8000-0000000000a1', paymentId: p1 }])
  })
})
