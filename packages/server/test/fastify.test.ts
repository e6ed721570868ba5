// What only the Fastify adapter has: route registration, its start-up check, inject(), and the types of
// request.idempotency. The HTTP contract it shares with the other adapters is in adapters/contract.test.ts.

import { Readable } from 'node:stream'
import type { TestDatabase } from '@oncely/test-support'
import Fastify from 'fastify'
import { afterAll, beforeAll, describe, expect, expectTypeOf, it } from 'vitest'
import { fastifyIdempotency } from '../src/fastify/index.js'
import {
  createEngine,
  type ExecutionContext,
  isStoreSetupError,
  migrate,
  postgresStore,
} from '../src/index.js'
import { createEngineForTesting } from '../src/testing/index.js'
import { auth, buildApp } from './app.js'
import { freshKey, setupDatabase, stallEventLoop } from './helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('fastify')
})
afterAll(async () => {
  await db?.drop()
})

/** A Fastify app whose error-level log lines are kept. */
function appWithLog() {
  const errors: Array<{ msg: string }> = []
  const app = Fastify({
    logger: { level: 'error', stream: { write: (line: string) => errors.push(JSON.parse(line)) } },
  })
  return { app, errors }
}

const engine = () => createEngine({ store: postgresStore({ pool: db.pool }) })
const reserved = async (key: string) =>
  (await db.pool.query('SELECT 1 FROM oncely.idempotency_keys WHERE key = $1', [key])).rowCount

describe('a route the plugin cannot make idempotent fails loudly', () => {
  it.each([
    ['registered before the plugin', false],
    ['registered next to a register() that was not awaited', true],
  ])('%s: 500, nothing runs, one error log with the fix', async (_, sameTick) => {
    const { app, errors } = appWithLog()
    let ran = 0
    const route = () =>
      app.post('/v1/early', { config: { idempotency: true } }, async (request) => {
        await request.idempotency.tx.query('SELECT 1')
        ran++
        return { ok: true }
      })
    if (sameTick) {
      void app.register(fastifyIdempotency, { engine: engine(), tenant: () => 't' })
      route()
    } else {
      route()
      await app.register(fastifyIdempotency, { engine: engine(), tenant: () => 't' })
    }
    try {
      // With a JSON body the parser refuses it; without one, reading request.idempotency does.
      for (const payload of [{ amount: 1 }, undefined, { amount: 2 }]) {
        const key = freshKey()
        const res = await app.inject({
          method: 'POST',
          url: '/v1/early',
          headers: { 'idempotency-key': key },
          ...(payload ? { payload } : {}),
        })
        expect(res.statusCode).toBe(500)
        expect(res.json().message).toBe('This route is not set up correctly.')
        expect(await reserved(key)).toBe(0)
      }
      expect(ran).toBe(0)
      const logged = errors.filter((line) => line.msg.includes('registered before the idempotency plugin'))
      expect(logged).toHaveLength(1)
      expect(logged[0]!.msg).toContain('POST /v1/early')
      expect(logged[0]!.msg).toContain('await app.register(fastifyIdempotency')
    } finally {
      await app.close()
    }
  })

  it('refuses config.idempotency on a GET route when it is registered', async () => {
    const { app } = await buildApp(db.pool)
    expect(() => app.get('/v1/list', { config: { idempotency: true } }, async () => [])).toThrow(
      /`config.idempotency` only on unsafe methods.*must not answer GET \(route GET \/v1\/list\)/,
    )
    await app.close()
  })

  it('refuses failOpen on a route not marked naturally idempotent, naming the option and route', async () => {
    const { app } = await buildApp(db.pool)
    expect(() => app.post('/x', { config: { idempotency: { failOpen: true } } }, async () => ({}))).toThrow(
      /config\.idempotency\.failOpen.*POST \/x/,
    )
    expect(() => app.post('/y', { config: { idempotency: { leaseMs: -1 } } }, async () => ({}))).toThrow(
      'Expected `config.idempotency.leaseMs` of route `POST /y` to be a positive integer, got -1.',
    )
    expect(() =>
      app.post(
        '/z',
        { config: { idempotency: { fingerprint: { query: 'yes' as never } } } },
        async () => ({}),
      ),
    ).toThrow('Expected `config.idempotency.fingerprint.query` of route `POST /z` to be a boolean.')
    await app.close()
  })

  it.each([
    [{}, /`engine` of @oncely\/server\/fastify/],
    [{ engine: {} }, /`engine` of @oncely\/server\/fastify/],
    [{ engine: 'x', tenant: () => 't' }, /`engine`/],
  ])('refuses a missing engine at registration', async (options, message) => {
    const app = Fastify()
    await expect(app.register(fastifyIdempotency, options as never).ready()).rejects.toThrow(message)
    await app.close().catch(() => {})
  })

  it('refuses a tenant that is not a function at registration', async () => {
    const app = Fastify()
    await expect(
      app.register(fastifyIdempotency, { engine: engine(), tenant: 'tenant_1' as never }).ready(),
    ).rejects.toThrow(
      'Expected `tenant` of @oncely/server/fastify to be a function. It gets the request and returns the tenant id.',
    )
    await app.close().catch(() => {})
  })
})

describe('the store is checked when the server starts', () => {
  it('without the migrations, ready() rejects with a StoreSetupError naming the table and migrate()', async () => {
    const app = Fastify()
    await app.register(fastifyIdempotency, {
      engine: createEngine({ store: postgresStore({ pool: db.pool, schema: 'never_migrated' }) }),
      tenant: () => 't',
    })
    const error = await app.ready().then(
      () => undefined,
      (e: unknown) => e,
    )
    expect(isStoreSetupError(error)).toBe(true)
    expect((error as Error).message).toMatch(
      /"never_migrated"\."idempotency_keys" does not exist.*migrate\(pool/,
    )
    await app.close().catch(() => {})
  })

  it('with the migrations, it starts', async () => {
    await migrate(db.pool, { schema: 'migrated' })
    const app = Fastify()
    await app.register(fastifyIdempotency, {
      engine: createEngine({ store: postgresStore({ pool: db.pool, schema: 'migrated' }) }),
      tenant: () => 't',
    })
    await expect(app.ready()).resolves.toBeDefined()
    await app.close()
  })
})

describe('inject() and the reply API', () => {
  it('replays a value the handler returned instead of calling reply.send', async () => {
    const { app } = await buildApp(db.pool)
    try {
      const key = freshKey()
      const send = () =>
        app.inject({
          method: 'POST',
          url: '/v1/notes',
          headers: { ...auth(), 'idempotency-key': key },
          payload: {},
        })
      const [a, b] = [await send(), await send()]
      expect(a.json()).toEqual({ ok: true, keyed: true })
      expect(b.rawPayload.equals(a.rawPayload)).toBe(true)
      expect(b.headers['idempotent-replayed']).toBe('true')
    } finally {
      await app.close()
    }
  })

  it('holds a streamed response until the commit, with the app onSend hooks (which run before the hold) kept', async () => {
    const app = Fastify()
    await app.register(fastifyIdempotency, { engine: engine(), tenant: () => 't' })
    const seen: string[] = []
    app.addHook('onSend', async (_request, reply, payload) => {
      seen.push(`${reply.statusCode} ${Buffer.isBuffer(payload) ? payload.toString() : typeof payload}`)
      reply.header('x-app-hook', 'ran')
      return payload
    })
    let runs = 0
    app.post('/v1/streamed', { config: { idempotency: true } }, async (request, reply) => {
      await request.idempotency.tx.query('SELECT 1')
      runs++
      return reply
        .code(201)
        .header('content-type', 'text/plain')
        .send(Readable.from([Buffer.from('chunk-1 '), Buffer.from('chunk-2')]))
    })
    try {
      const key = freshKey()
      const send = () =>
        app.inject({ method: 'POST', url: '/v1/streamed', headers: { 'idempotency-key': key }, payload: {} })
      const first = await send()
      const replay = await send()
      expect([first.statusCode, first.body, first.headers['x-app-hook']]).toEqual([
        201,
        'chunk-1 chunk-2',
        'ran',
      ])
      expect([replay.statusCode, replay.body, replay.headers['idempotent-replayed']]).toEqual([
        201,
        'chunk-1 chunk-2',
        'true',
      ])
      expect(runs).toBe(1)
      // App-level hooks run before the route's own: the first sees the handler's stream, the replay the stored bytes.
      expect(seen).toEqual(['201 object', '201 chunk-1 chunk-2'])
    } finally {
      await app.close()
    }
  })

  it('answers a body over the limit with the 413 problem under inject() too (its request is no socket)', async () => {
    const { app } = await buildApp(db.pool)
    try {
      const key = freshKey()
      const res = await app.inject({
        method: 'POST',
        url: '/v1/notes',
        headers: { ...auth(), 'idempotency-key': key, 'content-type': 'application/json' },
        payload: JSON.stringify({ padding: 'x'.repeat(2 * 1_048_576) }),
      })
      expect(res.statusCode).toBe(413)
      expect(res.headers['content-type']).toBe('application/problem+json')
      expect(res.json()).toMatchObject({ code: 'payload_too_large' })
      expect(await reserved(key)).toBe(0)
    } finally {
      await app.close()
    }
  })
})

describe('the type of request.idempotency', () => {
  it('is the execution context on routes that require a key, and possibly null elsewhere', () => {
    const app = Fastify()
    app.post('/a', { config: { idempotency: true } }, async (request) => {
      expectTypeOf(request.idempotency).toEqualTypeOf<ExecutionContext>()
    })
    app.post(
      '/b',
      { config: { idempotency: { required: true, wait: { timeoutMs: 1 } } } },
      async (request) => {
        expectTypeOf(request.idempotency).toEqualTypeOf<ExecutionContext>()
      },
    )
    app.post('/c', { config: { idempotency: { required: false } } }, async (request) => {
      expectTypeOf(request.idempotency).toEqualTypeOf<ExecutionContext | null>()
    })
    app.post('/d', async (request) => {
      expectTypeOf(request.idempotency).toEqualTypeOf<ExecutionContext | null>()
    })
  })
})

describe('what the core answers for a setup mistake or a lost lease, and logs with the fix', () => {
  async function appWith(options: { tenant?: () => string; leaseMs?: number; maxResponseBytes?: number }) {
    const { app, errors } = appWithLog()
    let stall = false
    const engine = createEngineForTesting({
      store: postgresStore({ pool: db.pool }),
      leaseMs: options.leaseMs ?? 30_000,
      maxResponseBytes: options.maxResponseBytes ?? 1_048_576,
      replayCache: false,
      hooks: {
        beforeCommit: () => {
          if (stall) stallEventLoop((options.leaseMs ?? 0) + 300)
        },
      },
    })
    await app.register(fastifyIdempotency, { engine, tenant: options.tenant ?? (() => 't') })
    app.post('/v1/things', { config: { idempotency: true } }, async () => ({ big: 'x'.repeat(64) }))
    await app.ready()
    const post = (key: string) =>
      app.inject({
        method: 'POST',
        url: '/v1/things',
        headers: { 'idempotency-key': key, 'content-type': 'application/json' },
        payload: { n: 1 },
      })
    return { app, errors, post, stallNext: () => (stall = true) }
  }

  it('a tenant id too long for the key index: 500 problem+json, nothing reserved, one error log', async () => {
    const { app, errors, post } = await appWith({ tenant: () => 't'.repeat(600) })
    const keys = [freshKey(), freshKey()]
    for (const key of keys) {
      const answer = await post(key)
      expect(answer.statusCode).toBe(500)
      expect(answer.headers['content-type']).toBe('application/problem+json')
      expect(await reserved(key)).toBe(0)
    }
    expect(errors.filter((e) => e.msg.includes('`scope` to have at most 512 bytes'))).toHaveLength(1)
    await app.close()
  })

  it('a response over maxResponseBytes: 500 response_too_large, stored and replayed, logged with the fix', async () => {
    const { app, errors, post } = await appWith({ maxResponseBytes: 16 })
    const key = freshKey()
    const first = await post(key)
    expect(first.statusCode).toBe(500)
    expect(first.json()).toMatchObject({ code: 'response_too_large' })
    const retry = await post(key)
    expect(retry.statusCode).toBe(500)
    expect(retry.headers['idempotent-replayed']).toBe('true')
    expect(errors.some((e) => e.msg.includes('exceeds maxResponseBytes (16)'))).toBe(true)
    await app.close()
  })

  it('an attempt whose process stalled past its lease: 503 lease_expired with Retry-After, logged naming leaseMs', async () => {
    const { app, errors, post, stallNext } = await appWith({ leaseMs: 300 })
    stallNext()
    const answer = await post(freshKey())
    expect(answer.statusCode).toBe(503)
    expect(answer.json()).toMatchObject({ code: 'lease_expired' })
    expect(answer.headers['retry-after']).toBe('1')
    expect(errors.some((e) => e.msg.includes('longer than leaseMs (300 ms)'))).toBe(true)
    await app.close()
  })
})
