// A body over the route's limit is refused with 413 before anything is reserved, and that 413 must reach the client
// every time: a client still sending its body must not see the connection reset (EPIPE, ECONNRESET) instead, or it
// takes a permanent refusal for a network error and retries it. Raw sockets, from a client that reads only once it
// wrote the whole body, so that nothing hides a reset; the same server matrix as the contract suite.

import { type RawOutcome, rawFlood, rawPost, type TestDatabase, tally } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { freshKey, setupDatabase } from '../helpers.js'
import { type AdapterName, adapters, type RunningApp } from './servers.js'

// Consecutive tries per adapter and case: a reset that loses the answer showed up in most tries before the fix.
const TRIES = 30
// 1.5 MB: well over the payments route's 1 KiB limit, and over Fastify's and the adapters' default 1 MiB.
const BYTES = 1_500_000

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('body_limit')
})
afterAll(async () => {
  await db?.drop()
})

const keyRows = async (keys: readonly string[]) =>
  (
    await db.pool.query('SELECT count(*)::int AS n FROM oncely.idempotency_keys WHERE key = ANY($1)', [
      keys as string[],
    ])
  ).rows[0].n as number

// NestJS's own body parser reads a body before any interceptor runs, so an oversize one gets Nest's 413 (the server
// README says so); with Nest's parser off, the layer's own 413 problem is in nestjs.test.ts.
const bounded = (Object.keys(adapters) as AdapterName[]).filter((name) => !name.startsWith('nestjs'))

describe.each(bounded)('%s', (name) => {
  let app: RunningApp
  beforeAll(async () => {
    app = await adapters[name](db.pool)
  })
  afterAll(async () => {
    await app?.close()
  })

  const framings = [
    ['announced (Content-Length)', 'content-length'],
    ['unannounced (chunked)', 'chunked'],
  ] as const
  const paces = [
    ['written fast', 'fast'],
    ['written slowly', 'slow'],
  ] as const
  const connections = ['keep-alive', 'close'] as const
  const cases = framings.flatMap(([framingName, framing]) =>
    paces.flatMap(([paceName, pace]) =>
      connections.map(
        (connection) =>
          [`${framingName}, ${paceName}, Connection: ${connection}`, framing, pace, connection] as const,
      ),
    ),
  )

  it.each(cases)(
    '%s: every try reads the complete 413 problem, with Connection: close, and no key row',
    async (_, framing, pace, connection) => {
      const keys: string[] = []
      const outcomes: RawOutcome[] = []
      for (let i = 0; i < TRIES; i++) {
        const key = freshKey('oversize')
        keys.push(key)
        outcomes.push(
          await rawPost({
            url: app.url,
            path: '/v1/payments',
            headers: {
              authorization: 'Bearer tenant_1',
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
        expect(JSON.parse(response?.body ?? '')).toMatchObject({ status: 413, code: 'payload_too_large' })
        expect(response?.headers.connection).toBe('close')
      }
      expect(await keyRows(keys)).toBe(0)
    },
    120_000,
  )

  it('a client that never stops sending gets the 413, then the connection closes after a bounded drain', async () => {
    const key = freshKey('flood')
    // 250 MiB if the server read on; it stops discarding after 16 MiB.
    const flood = await rawFlood({
      url: app.url,
      path: '/v1/payments',
      headers: {
        authorization: 'Bearer tenant_1',
        'content-type': 'application/json',
        'idempotency-key': key,
      },
      bytes: 250 * 1_048_576,
    })
    expect(flood.closed).toBe(true)
    expect(flood.response?.status).toBe(413)
    expect(flood.written).toBeLessThan(64 * 1_048_576)
    expect(await keyRows([key])).toBe(0)
  }, 60_000)
})
