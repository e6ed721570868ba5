import { randomUUID } from 'node:crypto'
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import type { FastifyInstance } from 'fastify'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { buildApp } from '../src/app.js'
import { prepareDatabase } from '../src/database.js'
import { createProvider } from '../src/provider.js'
import type { Ledger } from '../src/routes/ledger.js'
import { pay } from './support/app.js'

let db: TestDatabase
let app: FastifyInstance

beforeAll(async () => {
  db = await createTestDatabase('payments_ledger')
  await prepareDatabase(db.pool)
  app = await buildApp({ pool: db.pool, provider: createProvider({ pool: db.pool }), webRoot: false })
})
afterAll(async () => {
  await app?.close()
  await db?.drop()
})

const ledgerOf = async (tenant: string) => {
  const res = await app.inject({
    method: 'GET',
    url: '/v1/ledger',
    headers: { authorization: `Bearer ${tenant}` },
  })
  expect(res.statusCode).toBe(200)
  expect(res.headers['cache-control']).toBe('no-store')
  return res.json<Ledger>()
}

it("lists the tenant's payments and provider charges, newest first; a replayed key adds neither", async () => {
  expect(await ledgerOf('ledger_a')).toEqual({
    tenant: 'ledger_a',
    payments: [],
    charges: [],
    totals: { payments: 0, charges: 0 },
  })
  const key = randomUUID()
  const first = await pay(app, { amount: 100, currency: 'eur' }, { tenant: 'ledger_a', key })
  const replay = await pay(app, { amount: 100, currency: 'eur' }, { tenant: 'ledger_a', key })
  expect(replay.headers['idempotent-replayed']).toBe('true')
  const second = await pay(app, { amount: 2_000_000, currency: 'usd' }, { tenant: 'ledger_a' }) // declined: charge only
  expect(second.statusCode).toBe(402)
  await pay(app, { amount: 300, currency: 'eur' }, { tenant: 'ledger_b' })

  const ledger = await ledgerOf('ledger_a')
  expect(ledger.totals).toEqual({ payments: 1, charges: 2 })
  expect(ledger.payments).toEqual([
    {
      id: first.json().id,
      amount: 100,
      currency: 'eur',
      chargeId: first.json().chargeId,
      idempotencyKey: key,
    },
  ])
  expect(ledger.charges).toEqual([
    { chargeId: expect.any(String), amount: 2_000_000, currency: 'usd', status: 'declined' },
    { chargeId: first.json().chargeId, amount: 100, currency: 'eur', status: 'succeeded' },
  ])
  expect((await ledgerOf('ledger_b')).totals).toEqual({ payments: 1, charges: 1 })
})

it('answers 401 without a tenant', async () => {
  const res = await app.inject({ method: 'GET', url: '/v1/ledger' })
  expect(res.statusCode).toBe(401)
})
