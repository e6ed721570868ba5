/**
 * The charge as an atomic phase: its result commits as the key's recovery point, so an attempt that dies after it
 * (a failure, or a takeover after the lease) is resumed without calling the provider again.
 */
import { randomUUID } from 'node:crypto'
import { stepKeyFor } from '@oncely/server'
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { buildApp } from '../src/app.js'
import type { ChaosPoint } from '../src/config.js'
import { prepareDatabase } from '../src/database.js'
import { createProvider } from '../src/provider.js'
import { chaosConfig, count, countingProvider, pay, queuedRandom, recoveryPoint } from './support/app.js'

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('payments_recovery')
  await prepareDatabase(db.pool)
})
afterAll(() => db?.drop())

/** An app whose provider calls are counted, with `fault` run at every chaos point. */
async function appWith(fault: (point: ChaosPoint) => Promise<void>, options: { leaseMs?: number } = {}) {
  const draws = queuedRandom()
  const provider = countingProvider(createProvider({ pool: db.pool, failureRate: 0.5, random: draws.random }))
  const app = await buildApp({ pool: db.pool, provider, webRoot: false, faults: { at: fault }, ...options })
  return { app, provider, draws }
}

describe('the charge step', () => {
  it.each([
    ['a payment', 1250, 201],
    ['a decline', 1_000_001, 402],
  ])(
    'resumes %s from its recovery point after a crash past the charge: the provider is called once',
    async (_, amount, status) => {
      let crashed = false
      const { app, provider } = await appWith(async (point) => {
        if (point === 'after-provider' && !crashed) {
          crashed = true
          throw new Error('simulated crash after the charge step committed')
        }
      })
      try {
        const key = randomUUID()
        const tenant = `resume_${status}`
        const failed = await pay(app, { amount, currency: 'eur' }, { key, tenant })
        expect(failed.statusCode).toBe(500)
        const point = await recoveryPoint(db.pool, tenant, key)
        expect(point).toMatchObject({
          step: 'charge',
          state: {
            tenantId: tenant,
            body: { amount, currency: 'eur' },
            chargeId: expect.stringMatching(/^ch_/),
          },
        })
        expect(await count(db.pool, 'payments', ['tenant_id', tenant])).toBe(0)

        const retried = await pay(app, { amount, currency: 'eur' }, { key, tenant })
        expect(retried.statusCode).toBe(status)
        expect(retried.headers['idempotent-replayed']).toBeUndefined()
        expect(retried.json().chargeId).toBe(point?.state.chargeId)
        // The provider saw one call, under the key derived from (tenant, operation, key, step).
        expect([...provider.calls]).toEqual([[stepKeyFor(tenant, 'POST /v1/payments', key, 'charge'), 1]])
        expect(await count(db.pool, 'provider_charges', ['tenant_id', tenant])).toBe(1)
        expect(await count(db.pool, 'payments', ['tenant_id', tenant])).toBe(status === 201 ? 1 : 0)

        const replayed = await pay(app, { amount, currency: 'eur' }, { key, tenant })
        expect(replayed.statusCode).toBe(status)
        expect(replayed.headers['idempotent-replayed']).toBe('true')
        expect(replayed.body).toBe(retried.body)
      } finally {
        await app.close()
      }
    },
  )

  it('is resumed by a takeover after the lease; the stalled attempt is fenced out and answers the winner', async () => {
    let reached: () => void = () => {}
    const stalled = new Promise<void>((resolve) => {
      reached = resolve
    })
    let release: () => void = () => {}
    const gate = new Promise<void>((resolve) => {
      release = resolve
    })
    let held = false
    const { app, provider } = await appWith(
      async (point) => {
        if (point === 'after-provider' && !held) {
          held = true
          reached()
          // The process stalls past the lease (a live one renews it), then the attempt waits.
          Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 450)
          await gate
        }
      },
      { leaseMs: 300 },
    )
    try {
      const key = randomUUID()
      const tenant = 'takeover'
      const first = pay(app, { amount: 900, currency: 'usd' }, { key, tenant })
      await stalled
      const second = await pay(app, { amount: 900, currency: 'usd' }, { key, tenant })
      expect(second.statusCode).toBe(201)
      release()
      const late = await first
      expect(late.statusCode).toBe(201)
      expect(late.headers['idempotent-replayed']).toBe('true')
      expect(late.json().id).toBe(second.json().id)
      expect([...provider.calls.values()]).toEqual([1])
      expect(await count(db.pool, 'provider_charges', ['tenant_id', tenant])).toBe(1)
      expect(await count(db.pool, 'payments', ['tenant_id', tenant])).toBe(1)
    } finally {
      release()
      await app.close()
    }
  })

  it('saves no recovery point when the provider fails before charging: 503, then the retry charges once', async () => {
    const { app, provider, draws } = await appWith(async () => {})
    try {
      const key = randomUUID()
      const tenant = 'transient'
      draws.queue.push(0.1)
      const failed = await pay(app, { amount: 300, currency: 'eur' }, { key, tenant })
      expect(failed.statusCode).toBe(503)
      expect(failed.headers['retry-after']).toBe('1')
      expect(failed.headers['content-type']).toMatch(/^application\/problem\+json/)
      expect(failed.json()).toMatchObject({ code: 'provider_unavailable' })
      expect(await recoveryPoint(db.pool, tenant, key)).toBeNull()
      expect(await count(db.pool, 'provider_charges', ['tenant_id', tenant])).toBe(0)

      const retried = await pay(app, { amount: 300, currency: 'eur' }, { key, tenant })
      expect(retried.statusCode).toBe(201)
      // Nothing was charged, so the retry had to call the provider again, with the same key.
      expect([...provider.calls.values()]).toEqual([2])
      expect(await count(db.pool, 'provider_charges', ['tenant_id', tenant])).toBe(1)
      expect(await count(db.pool, 'payments', ['tenant_id', tenant])).toBe(1)
    } finally {
      await app.close()
    }
  })
})

describe('with idempotency disabled (chaos only)', () => {
  it('runs the same steps with a fresh provider key per attempt: a duplicate charges and pays twice', async () => {
    const provider = countingProvider(createProvider({ pool: db.pool }))
    const app = await buildApp({
      pool: db.pool,
      provider,
      webRoot: false,
      chaos: chaosConfig({ disableIdempotency: true }),
    })
    try {
      const key = randomUUID()
      const tenant = 'unsafe'
      const responses = [
        await pay(app, { amount: 100, currency: 'eur' }, { key, tenant }),
        await pay(app, { amount: 100, currency: 'eur' }, { key, tenant }),
      ]
      expect(responses.map((res) => res.statusCode)).toEqual([201, 201])
      expect(provider.calls.size).toBe(2)
      expect(await count(db.pool, 'payments', ['idempotency_key', key])).toBe(2)
      expect(await recoveryPoint(db.pool, tenant, key)).toBeNull()
    } finally {
      await app.close()
    }
  })
})
