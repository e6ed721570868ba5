// Acceptance: Postgres connections killed (pg_terminate_backend of the app's backends) under a load of concurrent
// requests. The process stays up, no intent takes effect twice, no key stays blocked past its lease, serving resumes.
import type { TestDatabase } from '@oncely/test-support'
import type { FastifyInstance } from 'fastify'
import pg from 'pg'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { buildApp } from './app.js'
import { freshKey, setupDatabase, sleep } from './helpers.js'
import { type HttpResult, postPayment, retryUntilFinal } from './http.js'

const LEASE_MS = 500
let db: TestDatabase
let killer: pg.Pool
let app: FastifyInstance
let url: string
let storeErrors = 0

beforeAll(async () => {
  db = await setupDatabase('kill', { application_name: 'oncely_app', max: 10 })
  killer = new pg.Pool({ connectionString: db.url, max: 1, application_name: 'oncely_killer' })
  killer.on('error', () => {})
  let events: Array<{ type: string }>
  ;({ app, events } = await buildApp(db.pool, { leaseMs: LEASE_MS, retentionMs: 60_000 }))
  url = await app.listen({ port: 0, host: '127.0.0.1' })
  storeErrors = 0
  const original = events.push.bind(events)
  events.push = (...items) => {
    storeErrors += items.filter((e) => e.type === 'store_error').length
    return original(...items)
  }
})
afterAll(async () => {
  await app.close()
  await killer.end()
  await db.drop()
})

it('survives killed connections: one effect per key, identical answers, nothing blocked past the lease', async () => {
  const keys = Array.from({ length: 20 }, () => freshKey('kill'))
  let killing = true
  let kills = 0
  const nemesis = (async () => {
    while (killing) {
      const { rowCount } = await killer.query(
        `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE application_name = 'oncely_app' AND datname = current_database()`,
      )
      kills += rowCount ?? 0
      await sleep(200)
    }
  })()

  // Three concurrent senders per key, each retrying like a client: 60 requests' worth of requests in flight.
  const answers: HttpResult[][] = keys.map(() => [])
  const load = keys.flatMap((key, i) =>
    Array.from({ length: 3 }, async () => {
      for (let attempt = 0; attempt < 5; attempt++) {
        const result = await postPayment(url, key, { cart: key, amount: 1 })
        answers[i]?.push(result)
        if (result.status === 201) return
        await sleep(30)
      }
    }),
  )
  await Promise.all(load)
  killing = false
  await nemesis
  expect(kills).toBeGreaterThan(0)
  expect(storeErrors).toBeGreaterThan(0)

  // Serving resumes, and every key settles within its lease (plus retry slack) after the faults stop.
  const settled = await Promise.all(
    keys.map((key) => retryUntilFinal(() => postPayment(url, key, { cart: key, amount: 1 }), LEASE_MS * 4)),
  )
  for (const result of settled) expect(result.status).toBe(201)

  const { rows } = await db.pool.query<{ cart: string; n: number }>(
    'SELECT cart, count(*)::int AS n FROM payments GROUP BY cart',
  )
  for (const row of rows) expect(row.n, `effects for ${row.cart}`).toBe(1)
  expect(rows).toHaveLength(keys.length)

  // Every 201 any client saw for a key is byte-identical to the stored response.
  keys.forEach((_, i) => {
    const final = settled[i] as HttpResult
    for (const seen of answers[i] ?? []) {
      if (seen.status === 201) expect(seen.body.equals(final.body)).toBe(true)
      else expect([0, 409, 500, 503]).toContain(seen.status)
    }
  })
}, 60_000)
