// The one policy of src/http/policy.ts, per adapter: a safe method never runs an idempotent handler (refused when
// the route is registered where the framework names its methods then, else answered 500 and logged once per route),
// and a body another parser read first is answered 500 and logged once per route, with the same answer everywhere.
// The body refusals from the headers and the body (413, 415, 400) are cases of the contract suite.
import type { Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { type ServerType, serve } from '@hono/node-server'
import Router from '@koa/router'
import type { TestDatabase } from '@oncely/test-support'
import express from 'express'
import express4 from 'express4'
import Fastify from 'fastify'
import { Hono } from 'hono'
import Koa from 'koa'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { idempotency as expressIdempotency } from '../../src/express/index.js'
import { fastifyIdempotency } from '../../src/fastify/index.js'
import { idempotency as fetchIdempotency } from '../../src/fetch/index.js'
import type { Engine } from '../../src/index.js'
import { idempotency as koaIdempotency } from '../../src/koa/index.js'
import { engineFor, freshKey, setupDatabase } from '../helpers.js'

let db: TestDatabase
let engine: Engine
beforeAll(async () => {
  db = await setupDatabase('policy')
  engine = engineFor(db.pool).engine
})
afterAll(async () => {
  await db?.drop()
})

/**
 * An app with an idempotent handler on `GET /list` and one on `POST /parsed` behind a body parser, counting the
 * handlers' runs and the adapter's error lines.
 */
interface PolicyApp {
  url: string
  errors: string[]
  runs: { count: number }
  close(): Promise<void>
}

async function listening(server: Server | ServerType) {
  if (!server.listening) await new Promise<void>((resolve) => server.once('listening', resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  }
}

function expressApp(framework: typeof express) {
  return async (): Promise<PolicyApp> => {
    const errors: string[] = []
    const runs = { count: 0 }
    const idempotent = expressIdempotency({
      engine,
      tenant: () => 'tenant_1',
      logger: { error: (_details, message) => errors.push(message) },
    })
    const app = framework()
    const handler = idempotent(async (_req, res) => {
      runs.count++
      res.json({ ran: true })
    })
    app.get('/list', handler)
    app.post('/parsed', framework.json(), handler)
    return { errors, runs, ...(await listening(app.listen(0, '127.0.0.1'))) }
  }
}

const apps: Record<string, () => Promise<PolicyApp>> = {
  'express 5': expressApp(express),
  'express 4': expressApp(express4),
  koa: async () => {
    const errors: string[] = []
    const runs = { count: 0 }
    const idempotent = koaIdempotency({
      engine,
      tenant: () => 'tenant_1',
      logger: { error: (_details, message) => errors.push(message) },
    })
    const app = new Koa()
    const router = new Router()
    const handler = async (ctx: Koa.Context) => {
      runs.count++
      ctx.body = { ran: true }
    }
    // What koa-bodyparser does: read the stream to its end and put the parsed body on the request.
    const bodyParser = async (ctx: Koa.Context, next: Koa.Next) => {
      const chunks: Buffer[] = []
      for await (const chunk of ctx.req) chunks.push(chunk as Buffer)
      ;(ctx.request as { body?: unknown }).body = JSON.parse(Buffer.concat(chunks).toString())
      await next()
    }
    router.get('/list', idempotent(), handler)
    router.post('/parsed', bodyParser, idempotent(), handler)
    app.use(router.routes())
    return { errors, runs, ...(await listening(app.listen(0, '127.0.0.1'))) }
  },
  'fetch (Hono)': async () => {
    const errors: string[] = []
    const runs = { count: 0 }
    const idempotent = fetchIdempotency({
      engine,
      tenant: () => 'tenant_1',
      logger: { error: (_details, message) => errors.push(message) },
    })
    const handler = idempotent(async () => {
      runs.count++
      return Response.json({ ran: true })
    })
    const app = new Hono()
    app.get('/list', (c) => handler(c.req.raw))
    // Read off the Request itself, which Hono does not cache.
    app.post('/parsed', async (c) => {
      await c.req.raw.json()
      return handler(c.req.raw)
    })
    return { errors, runs, ...(await listening(serve({ fetch: app.fetch, port: 0, hostname: '127.0.0.1' }))) }
  },
}

const NOT_SET_UP = { status: 500, detail: 'This route is not set up correctly.' }

describe.each(Object.keys(apps))('%s', (name) => {
  let app: PolicyApp
  beforeAll(async () => {
    app = await apps[name]!()
  })
  afterAll(() => app?.close())

  it('a GET on an idempotent handler: 500 problem+json, the handler never runs, one log line per route', async () => {
    for (let i = 0; i < 2; i++) {
      const res = await fetch(`${app.url}/list`, { headers: { 'idempotency-key': freshKey() } })
      expect(res.status).toBe(500)
      expect(res.headers.get('content-type')).toBe('application/problem+json')
      expect(await res.json()).toMatchObject(NOT_SET_UP)
    }
    expect(app.runs.count).toBe(0)
    const logged = app.errors.filter((message) => message.includes('refused a GET request'))
    expect(logged).toHaveLength(1)
    expect(logged[0]).toMatch(
      /safe methods are never idempotency-checked, so an idempotent handler must not answer GET \(route GET \/list\)/,
    )
  })

  it('a body another parser read first: 500 problem+json, nothing runs, one log line with the fix', async () => {
    for (let i = 0; i < 2; i++) {
      const res = await fetch(`${app.url}/parsed`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': freshKey() },
        body: '{"amount":1}',
      })
      expect(res.status).toBe(500)
      expect(res.headers.get('content-type')).toBe('application/problem+json')
      expect(await res.json()).toMatchObject(NOT_SET_UP)
    }
    expect(app.runs.count).toBe(0)
    const logged = app.errors.filter((message) => message.includes('was read by another body parser'))
    expect(logged).toHaveLength(1)
    expect(logged[0]).toMatch(/POST \/parsed/)
  })
})

// Fastify names a route's methods when it is registered, and the plugin owns the JSON parser of its routes (no
// other parser can read the body first): a safe method is refused there, before the server starts.
describe('fastify', () => {
  it('refuses config.idempotency on a GET route when it is registered, with the same explanation', async () => {
    const app = Fastify()
    await app.register(fastifyIdempotency, { engine, tenant: () => 'tenant_1' })
    expect(() => app.get('/list', { config: { idempotency: true } }, async () => ({}))).toThrow(
      /safe methods are never idempotency-checked, so an idempotent handler must not answer GET \(route GET \/list\)/,
    )
    await app.close()
  })
})
