// Acceptance: 50 concurrent requests with one key, split across two Fastify instances on one database.
import type { TestDatabase } from '@oncely/test-support'
import type { FastifyInstance } from 'fastify'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { buildApp } from './app.js'
import { freshKey, setupDatabase } from './helpers.js'
import { postPayment } from './http.js'

let db: TestDatabase
const apps: FastifyInstance[] = []
const urls: string[] = []
beforeAll(async () => {
  db = await setupDatabase('concurrency', { max: 30 })
  for (let i = 0; i < 2; i++) {
    const { app } = await buildApp(db.pool)
    urls.push(await app.listen({ port: 0, host: '127.0.0.1' }))
    apps.push(app)
  }
})
afterAll(async () => {
  for (const app of apps) await app.close()
  await db.drop()
})

it('executes once; every other response is 409 or the identical replay', async () => {
  const key = freshKey()
  const body = { cart: key, amount: 4200 }
  const results = await Promise.all(
    Array.from({ length: 50 }, (_, i) => postPayment(urls[i % 2] as string, key, body)),
  )
  const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [key])
  expect(rows[0].n).toBe(1)

  const created = results.filter((r) => r.status === 201)
  const conflicts = results.filter((r) => r.status === 409)
  expect(created.length + conflicts.length).toBe(50)
  const original = created.find((r) => r.headers.get('idempotent-replayed') === null)
  expect(original).toBeDefined()
  for (const replay of created) {
    expect(replay.body.equals(original?.body as Buffer)).toBe(true)
    expect(replay.headers.get('location')).toBe(original?.headers.get('location'))
  }
  expect(created.filter((r) => r.headers.get('idempotent-replayed') === null)).toHaveLength(1)
  for (const conflict of conflicts) {
    expect(conflict.headers.get('content-type')).toBe('application/problem+json')
    expect(Number(conflict.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
  }
})
