// GET /metrics: the engine's OpenTelemetry metrics in the Prometheus text format, as the README's queries read them.
import { randomUUID } from 'node:crypto'
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { buildApp } from '../src/app.js'
import { prepareDatabase } from '../src/database.js'
import { pay } from './support/app.js'

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('payments_metrics')
  await prepareDatabase(db.pool)
})
afterAll(() => db?.drop())

/** The value of the series `name{...labels}` that has every label in `labels`. */
function sample(text: string, name: string, labels: Record<string, string>): number | undefined {
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`)) continue
    if (Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`)))
      return Number(line.split(' ').at(-1))
  }
  return undefined
}

it('serves requests by outcome, durations and keys in progress in the Prometheus text format', async () => {
  const app = await buildApp({ pool: db.pool, webRoot: false })
  try {
    const key = randomUUID()
    expect((await pay(app, { amount: 100, currency: 'eur' }, { key })).statusCode).toBe(201)
    const replay = await pay(app, { amount: 100, currency: 'eur' }, { key })
    expect(replay.headers['idempotent-replayed']).toBe('true')
    expect((await pay(app, { amount: 999, currency: 'eur' }, { key })).statusCode).toBe(422)

    const res = await app.inject({ method: 'GET', url: '/metrics' })
    expect(res.statusCode).toBe(200)
    expect(res.headers['content-type']).toMatch(/^text\/plain/)
    const text = res.body
    const operation = { oncely_operation: 'POST /v1/payments', oncely_protocol: 'lock' }
    expect(sample(text, 'oncely_server_requests_total', { ...operation, oncely_outcome: 'executed' })).toBe(1)
    expect(sample(text, 'oncely_server_requests_total', { ...operation, oncely_outcome: 'replayed' })).toBe(1)
    expect(sample(text, 'oncely_server_requests_total', { ...operation, oncely_outcome: 'mismatch' })).toBe(1)
    expect(
      sample(text, 'oncely_server_request_duration_count', { ...operation, oncely_outcome: 'executed' }),
    ).toBe(1)
    expect(sample(text, 'oncely_server_active_executions', operation)).toBe(0)
    // Never the tenant or the key.
    expect(text).not.toContain('acme')
    expect(text).not.toContain(key)
  } finally {
    await app.close()
  }
})

it('can be turned off', async () => {
  const app = await buildApp({ pool: db.pool, webRoot: false, metrics: false })
  try {
    // A path no route matches needs credentials like any other, so ask with them: there is no such route.
    const res = await app.inject({
      method: 'GET',
      url: '/metrics',
      headers: { authorization: 'Bearer acme' },
    })
    expect(res.statusCode).toBe(404)
  } finally {
    await app.close()
  }
})
