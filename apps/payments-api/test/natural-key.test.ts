// The last line of defence: an idempotency key is forgotten after its retention, and a retry that comes later is a
// new request. The provider's step key and the ledger's natural key (one payment per tenant and charge) still make
// it one charge and one payment, answered as the first attempt was.
import { randomUUID } from 'node:crypto'
import { createTestDatabase, type TestDatabase, waitFor } from '@oncely/test-support'
import type { FastifyInstance } from 'fastify'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { buildApp } from '../src/app.js'
import { prepareDatabase } from '../src/database.js'
import { migrateApp } from '../src/migrate.js'
import { chaosConfig, count, pay } from './support/app.js'

let db: TestDatabase
let app: FastifyInstance
const events: string[] = []

beforeAll(async () => {
  db = await createTestDatabase('payments_ledger')
  await prepareDatabase(db.pool)
  // Keys are replayed for 1.5 s only, so a test can outlive one; the lease (which also bounds how long the payment's
  // transaction may sit idle while the provider is called) is long enough for a loaded machine.
  app = await buildApp({
    pool: db.pool,
    webRoot: false,
    leaseMs: 1_000,
    retentionMs: 1_500,
    onEvent: (event) => events.push(`${event.type}:${'key' in event ? event.key : ''}`),
  })
})
afterAll(async () => {
  await app?.close()
  await db?.drop()
})

async function expired(tenant: string, key: string): Promise<void> {
  await waitFor(`key ${key} to expire`, async () => {
    const { rows } = await db.pool.query(
      'SELECT expires_at <= now() AS expired FROM oncely.idempotency_keys WHERE scope = $1 AND key = $2',
      [tenant, key],
    )
    return rows[0]?.expired === true
  })
}

describe('a retry after its key expired', () => {
  it('is answered with the payment the first attempt recorded: one charge, one payment, one event', async () => {
    const tenant = `t${randomUUID().slice(0, 8)}`
    const key = randomUUID()
    const body = { amount: 4200, currency: 'eur', reference: 'late-retry' }
    const first = await pay(app, body, { tenant, key })
    expect(first.statusCode).toBe(201)
    await expired(tenant, key)

    const late = await pay(app, body, { tenant, key })
    // The engine treated it as new (no replay) ...
    expect(late.headers['idempotent-replayed']).toBeUndefined()
    expect(events).toContain(`expired:${key}`)
    // ... and the answer is still the first one.
    expect(late.statusCode).toBe(201)
    expect(late.json()).toEqual(first.json())
    expect(late.headers.location).toBe(first.headers.location)
    expect(await count(db.pool, 'payments', ['tenant_id', tenant])).toBe(1)
    expect(await count(db.pool, 'provider_charges', ['tenant_id', tenant])).toBe(1)
    expect(await count(db.pool, 'outbox', ['aggregate_id', first.json().id])).toBe(1)
  })

  it('with another amount is refused by the provider: a stored 422 that a retry replays, and nothing booked', async () => {
    // Regression: the provider's refusal was a retryable 500, so a client retrying it ran the payment again and again
    // and the key never finished.
    const tenant = `t${randomUUID().slice(0, 8)}`
    const key = randomUUID()
    const first = await pay(app, { amount: 100, currency: 'eur' }, { tenant, key })
    expect(first.statusCode).toBe(201)
    await expired(tenant, key)
    const late = await pay(app, { amount: 999, currency: 'eur' }, { tenant, key })
    expect(late.statusCode).toBe(422)
    expect(late.json()).toMatchObject({ code: 'provider_key_reused', status: 422 })
    const again = await pay(app, { amount: 999, currency: 'eur' }, { tenant, key })
    expect(again.statusCode).toBe(422)
    expect(again.headers['idempotent-replayed']).toBe('true')
    expect(again.json()).toEqual(late.json())
    const { rows } = await db.pool.query(
      'SELECT status FROM oncely.idempotency_keys WHERE scope = $1 AND key = $2',
      [tenant, key],
    )
    expect(rows).toEqual([{ status: 'failed_permanent' }])
    expect(await count(db.pool, 'payments', ['tenant_id', tenant])).toBe(1)
    expect(await count(db.pool, 'provider_charges', ['tenant_id', tenant])).toBe(1)
  })

  it('declined the first time is declined again with the same charge', async () => {
    const tenant = `t${randomUUID().slice(0, 8)}`
    const key = randomUUID()
    const body = { amount: 2_000_000, currency: 'eur' }
    const first = await pay(app, body, { tenant, key })
    expect(first.statusCode).toBe(402)
    await expired(tenant, key)
    const late = await pay(app, body, { tenant, key })
    expect(late.statusCode).toBe(402)
    expect(late.json()).toEqual(first.json())
    expect(await count(db.pool, 'payments', ['tenant_id', tenant])).toBe(0)
    expect(await count(db.pool, 'provider_charges', ['tenant_id', tenant])).toBe(1)
  })
})

describe('with the backstop disabled (chaos only)', () => {
  it('books a second payment for the same charge when a retry comes after its key expired', async () => {
    const other = await createTestDatabase('payments_ledger_unsafe')
    const unsafe = await prepareDatabase(other.pool, { unsafeDisableBackstop: true }).then(() =>
      buildApp({
        pool: other.pool,
        webRoot: false,
        // The lease also bounds how long the payment's transaction may sit idle while the provider is called: long
        // enough for a loaded machine (at 200 ms the first payment was once answered 503).
        leaseMs: 1_000,
        retentionMs: 1_500,
        chaos: chaosConfig({ disableBackstop: true }),
      }),
    )
    try {
      const key = randomUUID()
      const body = { amount: 100, currency: 'eur' }
      expect((await pay(unsafe, body, { key })).statusCode).toBe(201)
      await waitFor('the key to expire', async () => {
        const { rows } = await other.pool.query(
          'SELECT expires_at <= now() AS expired FROM oncely.idempotency_keys',
        )
        return rows[0]?.expired === true
      })
      expect((await pay(unsafe, body, { key })).statusCode).toBe(201)
      const { rows } = await other.pool.query(
        'SELECT count(*)::int AS n, count(DISTINCT charge_id)::int AS charges FROM payments',
      )
      expect(rows[0]).toEqual({ n: 2, charges: 1 })
    } finally {
      await unsafe.close()
      await other.drop()
    }
  })
})

describe('the natural-key migration', () => {
  it('stops on a ledger that already holds two payments for one charge, and says how to find them', async () => {
    const other = await createTestDatabase('payments_ledger_dups')
    try {
      await prepareDatabase(other.pool)
      // A ledger as the demo wrote it before the constraint existed.
      await other.pool.query('ALTER TABLE payments DROP CONSTRAINT payments_tenant_charge_key')
      await other.pool.query("DELETE FROM payments_api_migrations WHERE name = 'payments_natural_key'")
      for (let n = 0; n < 2; n++) {
        await other.pool.query(
          "INSERT INTO payments (id, tenant_id, amount, currency, charge_id) VALUES ($1, 'acme', 100, 'eur', 'ch_1')",
          [randomUUID()],
        )
      }
      await expect(migrateApp(other.pool)).rejects.toThrow('more than one row for some provider charge')
      await other.pool.query(
        "DELETE FROM payments WHERE id = (SELECT id FROM payments WHERE charge_id = 'ch_1' LIMIT 1)",
      )
      expect(await migrateApp(other.pool)).toEqual(['payments_natural_key'])
    } finally {
      await other.drop()
    }
  })
})
