// The demo API's POST /v1/payments keeps Fastify's default body limit (1 MiB): a larger body gets 413 before any
// key is reserved, and that 413 must reach the client every time, also one still sending the body, so the SDK
// never retries it as a network error.
import { randomUUID } from 'node:crypto'
import { createClient, HTTPError, memoryStore } from '@oncely/client'
import { createTestDatabase, type RawOutcome, rawPost, type TestDatabase, tally } from '@oncely/test-support'
import type { FastifyInstance } from 'fastify'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { buildApp } from '../src/app.js'
import { prepareDatabase } from '../src/database.js'
import { createProvider } from '../src/provider.js'
import { count } from './support/app.js'

const TRIES = 30
const BYTES = 1_500_000

let db: TestDatabase
let app: FastifyInstance
let url: string
beforeAll(async () => {
  db = await createTestDatabase('payments_body_limit')
  await prepareDatabase(db.pool)
  app = await buildApp({ pool: db.pool, provider: createProvider({ pool: db.pool }), webRoot: false })
  url = await app.listen({ port: 0, host: '127.0.0.1' })
})
afterAll(async () => {
  await app?.close()
  await db?.drop()
})

const keyRows = async (keys: readonly string[]) => {
  const { rows } = await db.pool.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM oncely.idempotency_keys WHERE key = ANY($1)',
    [keys as string[]],
  )
  return rows[0]!.n
}

it.each([
  ['announced (Content-Length), written slowly, Connection: close', 'content-length', 'slow', 'close'],
  ['unannounced (chunked), written slowly, Connection: keep-alive', 'chunked', 'slow', 'keep-alive'],
  ['unannounced (chunked), written slowly, Connection: close', 'chunked', 'slow', 'close'],
  [
    'announced (Content-Length), written fast, Connection: keep-alive',
    'content-length',
    'fast',
    'keep-alive',
  ],
] as const)(
  '%s: every try reads the complete 413 problem, and no key row',
  async (_, framing, pace, connection) => {
    const keys: string[] = []
    const outcomes: RawOutcome[] = []
    for (let i = 0; i < TRIES; i++) {
      const key = randomUUID()
      keys.push(key)
      outcomes.push(
        await rawPost({
          url,
          path: '/v1/payments',
          headers: {
            authorization: 'Bearer acme',
            'content-type': 'application/json',
            'idempotency-key': key,
            connection,
          },
          bytes: BYTES,
          framing,
          pace,
        }),
      )
    }
    expect(tally(outcomes)).toEqual({ 413: TRIES })
    for (const { response } of outcomes) {
      expect(response?.headers['content-type']).toBe('application/problem+json')
      expect(response?.headers.connection).toBe('close')
      expect(JSON.parse(response?.body ?? '')).toMatchObject({ status: 413, code: 'payload_too_large' })
    }
    expect(await keyRows(keys)).toBe(0)
    expect(await count(db.pool, 'payments')).toBe(0)
  },
  120_000,
)

it('the client SDK gets the 413 as a permanent HTTPError, sent once and never retried', async () => {
  const client = createClient({ baseUrl: url, store: memoryStore(), resumeOnOnline: false })
  const retries: unknown[] = []
  client.on('retry', (event) => retries.push(event))
  const error = await client
    .request({
      method: 'POST',
      path: '/v1/payments',
      headers: { authorization: 'Bearer acme' },
      json: { amount: 1250, currency: 'eur', reference: 'x'.repeat(BYTES) },
    })
    .then(
      () => undefined,
      (reason: unknown) => reason,
    )
  expect(error).toBeInstanceOf(HTTPError)
  expect(error).toMatchObject({ status: 413, problem: { code: 'payload_too_large' } })
  expect(retries).toEqual([])
})
