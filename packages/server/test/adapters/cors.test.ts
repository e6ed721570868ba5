// A browser client on another origin, as each adapter's usual CORS library sees it, set up with corsHeaders(): the
// preflight allows oncely's request headers, and every answer (the first, a replay, a problem) exposes oncely's
// response headers. Real servers, real CORS libraries; the browser's checks are the assertions.
import type { AddressInfo } from 'node:net'
import fastifyCors from '@fastify/cors'
import { serve } from '@hono/node-server'
import type { TestDatabase } from '@oncely/test-support'
import cors from 'cors'
import express from 'express'
import Fastify from 'fastify'
import { type Context, Hono } from 'hono'
import { cors as honoCors } from 'hono/cors'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { idempotency as expressIdempotency } from '../../src/express/index.js'
import { fastifyIdempotency } from '../../src/fastify/index.js'
import { idempotency as fetchIdempotency } from '../../src/fetch/index.js'
import { corsHeaders } from '../../src/index.js'
import { engineFor, freshKey, setupDatabase } from '../helpers.js'

const ORIGIN = 'https://shop.example'
const headers = corsHeaders({ allowedHeaders: ['Authorization'], exposedHeaders: ['Location'] })

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('cors')
})
afterAll(async () => {
  await db?.drop()
})

interface Running {
  url: string
  close(): Promise<void>
}

const listening = async (server: {
  address(): AddressInfo | string | null
  close(done: () => void): void
  listening: boolean
  once(event: 'listening', done: () => void): void
}): Promise<Running> => {
  if (!server.listening) await new Promise<void>((resolve) => server.once('listening', resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  }
}

const servers: Record<string, () => Promise<Running>> = {
  'fastify + @fastify/cors': async () => {
    const app = Fastify()
    await app.register(fastifyCors, { origin: ORIGIN, ...headers })
    await app.register(fastifyIdempotency, { engine: engineFor(db.pool).engine, tenant: () => 'tenant_1' })
    app.post('/v1/orders', { config: { idempotency: true } }, async (request, reply) =>
      reply.code(201).header('location', '/v1/orders/1').send({ got: request.body }),
    )
    await app.listen({ port: 0, host: '127.0.0.1' })
    return { url: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`, close: () => app.close() }
  },
  'express + cors': async () => {
    const app = express()
    app.use(cors({ origin: ORIGIN, ...headers }))
    const idempotent = expressIdempotency({ engine: engineFor(db.pool).engine, tenant: () => 'tenant_1' })
    app.post(
      '/v1/orders',
      idempotent(async (req, res) => {
        res.status(201).location('/v1/orders/1').json({ got: req.body })
      }),
    )
    return listening(app.listen(0, '127.0.0.1'))
  },
  'hono + hono/cors': async () => {
    const app = new Hono()
    app.use(
      honoCors({
        origin: ORIGIN,
        allowHeaders: headers.allowedHeaders,
        exposeHeaders: headers.exposedHeaders,
      }),
    )
    const idempotent = fetchIdempotency({
      engine: engineFor(db.pool).engine,
      tenant: (_r, _c: Context) => 'tenant_1',
    })
    const create = idempotent({ route: '/v1/orders' }, async (_request, { body }) =>
      Response.json({ got: body }, { status: 201, headers: { location: '/v1/orders/1' } }),
    )
    app.post('/v1/orders', (c) => create(c.req.raw, c))
    return listening(serve({ fetch: app.fetch, port: 0, hostname: '127.0.0.1' }))
  },
}

const list = (value: string | null) => (value ?? '').split(',').map((name) => name.trim().toLowerCase())

describe.each(Object.keys(servers))('%s', (name) => {
  let server: Running
  beforeAll(async () => {
    server = await servers[name]!()
  })
  afterAll(async () => {
    await server?.close()
  })
  const post = (key: string | undefined, body: unknown) =>
    fetch(`${server.url}/v1/orders`, {
      method: 'POST',
      headers: {
        origin: ORIGIN,
        authorization: 'Bearer acct_1',
        'content-type': 'application/json',
        'oncely-attempt': '1',
        ...(key === undefined ? {} : { 'idempotency-key': key }),
      },
      body: JSON.stringify(body),
    })
  /** What a browser checks before it hands a cross-origin answer, and these headers, to the page. */
  const expectReadable = (res: Response) => {
    expect(res.headers.get('access-control-allow-origin')).toBe(ORIGIN)
    expect(list(res.headers.get('access-control-expose-headers'))).toEqual(
      expect.arrayContaining(['idempotent-replayed', 'retry-after', 'location']),
    )
  }

  it('the preflight allows every header the client sends', async () => {
    const res = await fetch(`${server.url}/v1/orders`, {
      method: 'OPTIONS',
      headers: {
        origin: ORIGIN,
        'access-control-request-method': 'POST',
        'access-control-request-headers': 'authorization,content-type,idempotency-key,oncely-attempt',
      },
    })
    expect(res.status).toBeLessThan(300)
    expect(res.headers.get('access-control-allow-origin')).toBe(ORIGIN)
    expect(list(res.headers.get('access-control-allow-headers'))).toEqual(
      expect.arrayContaining(['authorization', 'content-type', 'idempotency-key', 'oncely-attempt']),
    )
  })

  it('the first answer, its replay and a problem all expose the replay and Retry-After headers', async () => {
    const key = freshKey()
    const first = await post(key, { n: 1 })
    expect(first.status).toBe(201)
    expectReadable(first)
    const replay = await post(key, { n: 1 })
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expectReadable(replay)
    const reused = await post(key, { n: 2 })
    expect(reused.status).toBe(422)
    expectReadable(reused)
    const missing = await post(undefined, { n: 1 })
    expect(missing.status).toBe(400)
    expectReadable(missing)
  })
})

describe('corsHeaders()', () => {
  it("lists oncely's headers, then yours once each whatever their case", () => {
    expect(corsHeaders()).toEqual({
      allowedHeaders: ['Content-Type', 'Idempotency-Key', 'Oncely-Attempt'],
      exposedHeaders: ['Idempotent-Replayed', 'Retry-After'],
    })
    expect(
      corsHeaders({
        allowedHeaders: ['Authorization', 'idempotency-key', 'authorization'],
        exposedHeaders: ['ETag'],
      }),
    ).toEqual({
      allowedHeaders: ['Content-Type', 'Idempotency-Key', 'Oncely-Attempt', 'Authorization'],
      exposedHeaders: ['Idempotent-Replayed', 'Retry-After', 'ETag'],
    })
  })

  it('checks its options, naming the bad one', () => {
    expect(() => corsHeaders({ allowedHeaders: 'Authorization' as never })).toThrow(
      "Expected `allowedHeaders` of corsHeaders() to be an array of header names, such as ['X-Request-Id'].",
    )
    expect(() => corsHeaders({ exposedHeaders: ['Not a header'] })).toThrow(/`exposedHeaders` of corsHeaders/)
    expect(() => corsHeaders(null as never)).toThrow(/options of corsHeaders/)
  })
})
