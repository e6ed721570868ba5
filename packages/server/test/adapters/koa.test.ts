// What only the Koa adapter has: the bodies a handler sets on ctx (a stream, text, bytes, none), routers mounted
// under a prefix, a handler that writes to ctx.res itself, the middleware outside a route, option checks and the
// type of ctx.state.idempotency. The shared HTTP contract is in contract.test.ts.
import type { Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { Readable } from 'node:stream'
import Router from '@koa/router'
import type { TestDatabase } from '@oncely/test-support'
import Koa from 'koa'
import { afterAll, beforeAll, describe, expect, expectTypeOf, it } from 'vitest'
import type { ExecutionContext } from '../../src/engine/types.js'
import { idempotency, type KoaIdempotencyState } from '../../src/koa/index.js'
import { engineFor, freshKey, setupDatabase } from '../helpers.js'

let db: TestDatabase
let url: string
let server: Server
const errors: string[] = []
/** The errors that reached the app's error middleware. */
const thrown: string[] = []

beforeAll(async () => {
  db = await setupDatabase('koa')
  const idempotent = idempotency({
    engine: engineFor(db.pool).engine,
    tenant: () => 'tenant_1',
    logger: { error: (_details, message) => errors.push(message) },
  })
  const insert = async (ctx: { state: KoaIdempotencyState }) => {
    await ctx.state.idempotency.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 1)', [
      'tenant_1',
      (ctx.state.body as { cart: string }).cart,
    ])
  }
  const app = new Koa()
  app.use(async (ctx, next) => {
    try {
      await next()
    } catch (error) {
      thrown.push((error as Error).message)
      ctx.status = (error as { statusCode?: number }).statusCode ?? 500
      ctx.body = { error: (error as Error).message }
    }
  })
  const router = new Router()
  router.post<KoaIdempotencyState>('/stream', idempotent(), async (ctx) => {
    await insert(ctx)
    ctx.status = 201
    ctx.type = 'application/json'
    ctx.body = Readable.from(['{"streamed":', 'true}'])
  })
  router.post<KoaIdempotencyState>('/text', idempotent(), async (ctx) => {
    await insert(ctx)
    ctx.status = 202
    ctx.body = 'accepted'
  })
  router.post<KoaIdempotencyState>('/bytes', idempotent(), async (ctx) => {
    await insert(ctx)
    ctx.body = Buffer.from([1, 2, 3])
  })
  router.post<KoaIdempotencyState>('/empty', idempotent(), async (ctx) => {
    await insert(ctx)
    ctx.status = 204
  })
  router.post<KoaIdempotencyState>('/raw', idempotent(), async (ctx) => {
    await insert(ctx)
    ctx.respond = false
    ctx.res.statusCode = 200
    ctx.res.end('written directly')
  })
  // The route's template is the layer's path with the prefixes of the routers it is mounted in.
  const nested = new Router({ prefix: '/v2' })
  nested.post<KoaIdempotencyState>('/accounts/:account/charges', idempotent(), async (ctx) => {
    await insert(ctx)
    ctx.status = 201
    ctx.body = { account: ctx.params.account }
  })
  router.use('/api', nested.routes())
  app.use(router.routes())
  app.use(idempotent())
  server = app.listen(0, '127.0.0.1')
  await new Promise<void>((resolve) => server.once('listening', resolve))
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(async () => {
  await new Promise<void>((resolve) => server?.close(() => resolve()))
  await db?.drop()
})

const post = (path: string, key: string, body: unknown) =>
  fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: JSON.stringify(body),
  })
async function until(condition: () => boolean): Promise<void> {
  for (let i = 0; !condition(); i++) {
    if (i > 500) throw new Error('condition not met in time')
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}
const effects = async (cart: string) =>
  (await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [cart])).rows[0].n as number

describe('what the handler sets on ctx is held, then sent or replayed', () => {
  it.each([
    ['a stream', '/stream', 201, '{"streamed":true}', 'application/json; charset=utf-8'],
    ['text', '/text', 202, 'accepted', 'text/plain; charset=utf-8'],
    ['bytes', '/bytes', 200, '\u0001\u0002\u0003', 'application/octet-stream'],
    ['no body (204)', '/empty', 204, '', null],
  ])('%s', async (_, path, status, text, type) => {
    const key = freshKey()
    const first = await post(path, key, { cart: key })
    const firstText = await first.text()
    const replay = await post(path, key, { cart: key })
    expect(first.status).toBe(status)
    expect(firstText).toBe(text)
    expect(first.headers.get('content-type')).toBe(type)
    expect(replay.status).toBe(status)
    expect(await replay.text()).toBe(text)
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expect(replay.headers.get('content-type')).toBe(type)
    expect(await effects(key)).toBe(1)
  })

  it('names the operation by the template with the prefixes of the routers above it', async () => {
    const key = freshKey()
    const first = await post('/api/v2/accounts/A/charges', key, { cart: key })
    expect(first.status).toBe(201)
    expect(await first.json()).toEqual({ account: 'A' })
    expect((await post('/api/v2/accounts/B/charges', key, { cart: key })).status).toBe(422)
    const { rows } = await db.pool.query('SELECT operation FROM oncely.idempotency_keys WHERE key = $1', [
      key,
    ])
    expect(rows).toEqual([{ operation: 'POST /api/v2/accounts/:account/charges' }])
  })
})

describe('misuse fails loudly', () => {
  it('a handler that writes to ctx.res itself: a retryable error, its writes rolled back and its key released', async () => {
    // What it wrote left at once (nothing can hold it), so the error cannot reach the client; it reaches the app.
    const key = freshKey()
    const refused = () =>
      thrown.filter((message) =>
        /answer through ctx\.body and ctx\.status; it wrote to ctx\.res/.test(message),
      )
    for (let i = 1; i <= 2; i++) {
      const res = await post('/raw', key, { cart: key })
      expect(await res.text()).toBe('written directly')
      expect(res.headers.get('idempotent-replayed')).toBeNull()
      // The error comes once the attempt was rolled back and its key released, after the client got the bytes.
      await until(() => refused().length === i)
    }
    expect(await effects(key)).toBe(0)
  })

  it('outside a route (app.use) it cannot name the operation: 500, and the log says to use it on a route', async () => {
    const res = await post('/nowhere', freshKey(), {})
    expect(res.status).toBe(500)
    expect(res.headers.get('content-type')).toBe('application/problem+json')
    expect(errors.some((message) => message.includes('outside a route of @koa/router'))).toBe(true)
  })

  it('options are checked when the adapter and each route are set up, naming the option', () => {
    const engine = engineFor(db.pool).engine
    expect(() => idempotency({ engine: {} as never, tenant: () => 't' })).toThrow(
      /`engine` of @oncely\/server\/koa/,
    )
    expect(() => idempotency({ engine, tenant: 't' as never })).toThrow(/`tenant` of @oncely\/server\/koa/)
    expect(() => idempotency({ engine, tenant: () => 't', logger: console.error as never })).toThrow(
      /`logger` of @oncely\/server\/koa/,
    )
    const idempotent = idempotency({ engine, tenant: () => 't' })
    expect(() => idempotent({ leaseMs: 0 })).toThrow(
      'Expected `leaseMs` of `idempotent()` to be a positive integer, got 0.',
    )
    expect(() => idempotent({ fingerprint: { include: 'amount' as never } })).toThrow(
      'Expected `fingerprint.include` of `idempotent()` to be an array of strings.',
    )
    expect(() => idempotent((async () => {}) as never)).toThrow(/not a handler/)
  })

  it('types ctx.state.idempotency as present unless the route is optional', () => {
    const idempotent = idempotency({ engine: engineFor(db.pool).engine, tenant: () => 't' })
    const router = new Router()
    router.post<KoaIdempotencyState>('/a', idempotent(), async (ctx) => {
      expectTypeOf(ctx.state.idempotency).toEqualTypeOf<ExecutionContext>()
    })
    router.post<KoaIdempotencyState<ExecutionContext | null>>(
      '/b',
      idempotent({ required: false }),
      async (ctx) => {
        expectTypeOf(ctx.state.idempotency).toEqualTypeOf<ExecutionContext | null>()
      },
    )
  })
})
