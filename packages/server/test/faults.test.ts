// Acceptance: a failure injected at each step of the protocol, and a paused attempt fenced out, over real HTTP.
import type { TestDatabase } from '@oncely/test-support'
import type { FastifyInstance } from 'fastify'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { EngineHooks } from '../src/testing/index.js'
import { buildApp } from './app.js'
import { freshKey, reservation, setupDatabase, stallEventLoop } from './helpers.js'
import { postPayment, retryUntilFinal } from './http.js'

type Step = keyof EngineHooks
let db: TestDatabase
let app: FastifyInstance
let url: string
/**
 * The hook to fail once, and the hook to pause once: the process stalls there past the lease (renewing nothing, as a
 * paused or starved process would), then the attempt waits until `resume` is called.
 */
const armed: { fail?: Step; pause?: Step; resume?: () => void; paused?: () => void } = {}

const LEASE_MS = 300

beforeAll(async () => {
  db = await setupDatabase('faults')
  const hook = (step: Step) => async () => {
    if (armed.fail === step) {
      armed.fail = undefined
      throw new Error(`injected crash at ${step}`)
    }
    if (armed.pause === step) {
      armed.pause = undefined
      armed.paused?.()
      stallEventLoop(LEASE_MS + 100)
      await new Promise<void>((resolve) => {
        armed.resume = resolve
      })
    }
  }
  ;({ app } = await buildApp(db.pool, {
    leaseMs: LEASE_MS,
    hooks: {
      afterReserve: hook('afterReserve'),
      beforeCommit: hook('beforeCommit'),
      afterCommit: hook('afterCommit'),
    },
  }))
  url = await app.listen({ port: 0, host: '127.0.0.1' })
})
afterAll(async () => {
  await app.close()
  await db.drop()
})

const effects = async (cart: string) =>
  (await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [cart])).rows[0].n as number

describe('an injected failure, then the client retries', () => {
  it.each<[string, Step]>([
    ['after the reservation', 'afterReserve'],
    ['just before commit', 'beforeCommit'],
    ['just after commit, before the reply', 'afterCommit'],
  ])('%s: exactly one effect and the same response on every retry', async (_, step) => {
    const key = freshKey()
    const body = { cart: key, amount: 1 }
    armed.fail = step
    const first = await postPayment(url, key, body)
    expect(first.status).toBeGreaterThanOrEqual(500)
    expect(first.status).toBeLessThan(600)
    const retry = await retryUntilFinal(() => postPayment(url, key, body))
    const again = await postPayment(url, key, body)
    expect(retry.status).toBe(201)
    expect(again.status).toBe(201)
    expect(again.body.equals(retry.body)).toBe(true)
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(await effects(key)).toBe(1)
  })

  it('after the business write (the handler throws): rolled back, and the retry executes once', async () => {
    const key = freshKey()
    let failures = 1
    const flaky = await buildApp(db.pool, { leaseMs: LEASE_MS })
    flaky.app.post('/v1/flaky', { config: { idempotency: true } }, async (request, reply) => {
      await request.idempotency.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 1)', [
        request.user,
        key,
      ])
      if (failures-- > 0) throw new Error('crashed after the business write')
      return reply.code(201).send({ cart: key, attempt: request.idempotency.attempt })
    })
    const send = () =>
      flaky.app.inject({
        method: 'POST',
        url: '/v1/flaky',
        headers: { authorization: 'Bearer t', 'idempotency-key': key },
        payload: {},
      })
    expect((await send()).statusCode).toBe(500)
    expect(await effects(key)).toBe(0)
    const retry = await send()
    const replay = await send()
    expect(retry.statusCode).toBe(201)
    // `attempt` counts attempts that left a record: the lock protocol's rolled-back attempt left none.
    expect(retry.json()).toEqual({ cart: key, attempt: reservation === 'row' ? 2 : 1 })
    expect(replay.rawPayload.equals(retry.rawPayload)).toBe(true)
    expect(await effects(key)).toBe(1)
    await flaky.app.close()
  })
})

describe('a commit that fails', () => {
  it('never reaches the client as a 2xx, and the retry executes once', async () => {
    const key = freshKey()
    let armedOnce = true
    const broken = await buildApp(db.pool, {
      leaseMs: LEASE_MS,
      hooks: {
        // The connection dies between the handler and the completion: the business writes cannot commit.
        beforeCommit: async ({ tx }) => {
          if (armedOnce) {
            armedOnce = false
            await tx?.query('SELECT pg_terminate_backend(pg_backend_pid())').catch(() => {})
          }
        },
      },
    })
    const burl = await broken.app.listen({ port: 0, host: '127.0.0.1' })
    try {
      const body = { cart: key, amount: 3 }
      const first = await postPayment(burl, key, body)
      expect(first.status).toBe(503)
      expect(first.headers.get('content-type')).toBe('application/problem+json')
      expect(first.headers.get('location')).toBeNull()
      expect(await effects(key)).toBe(0)
      const retry = await retryUntilFinal(() => postPayment(burl, key, body))
      expect(retry.status).toBe(201)
      expect(await effects(key)).toBe(1)
    } finally {
      await broken.app.close()
    }
  })
})

describe('fencing', () => {
  it('an attempt paused past its lease is rolled back and answers with the winner’s response', async () => {
    const key = freshKey()
    const body = { cart: key, amount: 7 }
    const paused = new Promise<void>((resolve) => {
      armed.paused = resolve
    })
    armed.pause = 'beforeCommit'
    const original = postPayment(url, key, body)
    await paused
    const winner = await postPayment(url, key, body)
    expect(winner.status).toBe(201)
    expect(winner.headers.get('idempotent-replayed')).toBeNull()
    armed.resume?.()
    const late = await original
    expect(late.status).toBe(201)
    expect(late.headers.get('idempotent-replayed')).toBe('true')
    expect(late.body.equals(winner.body)).toBe(true)
    expect(late.headers.get('location')).toBe(winner.headers.get('location'))
    expect(await effects(key)).toBe(1)
  })
})
