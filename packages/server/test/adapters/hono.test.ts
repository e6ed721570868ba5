// The Fetch adapter behind Hono middleware that reads the body first: Hono's own validator('json'), c.req.json() or
// c.req.arrayBuffer() in front of an idempotent route. Hono caches what it read on its request (c.req.bodyCache), and
// the adapter takes the body from there. Over a real socket, on @hono/node-server.
import { type ServerType, serve } from '@hono/node-server'
import type { TestDatabase } from '@oncely/test-support'
import { type Context, Hono } from 'hono'
import { validator } from 'hono/validator'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { idempotency } from '../../src/fetch/index.js'
import { engineFor, freshKey, setupDatabase } from '../helpers.js'

let db: TestDatabase
let server: ServerType
let url: string
const errors: string[] = []
let runs = 0

type Order = { cart: string; amount: number }

beforeAll(async () => {
  db = await setupDatabase('hono')
  const idempotent = idempotency({
    engine: engineFor(db.pool).engine,
    tenant: (_request, _c: Context) => 'tenant_1',
    logger: { error: (_details, message) => errors.push(message) },
  })
  const book = idempotent({ maxBodyBytes: 256 }, async (_request, { body, idempotency: ctx }, c) => {
    runs++
    const order = body as Order
    await ctx.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, $3)', [
      'tenant_1',
      order.cart,
      order.amount,
    ])
    // What the validator handed on is what the adapter fingerprinted.
    const validated = c.req.valid('json' as never) as unknown
    return Response.json({ body, validated: validated ?? null }, { status: 201 })
  })
  const app = new Hono()
  const isOrder = validator('json', (value, c) => {
    const order = value as Partial<Order>
    if (typeof order.cart !== 'string' || typeof order.amount !== 'number')
      return c.json({ invalid: true }, 400)
    return order as Order
  })
  app.post('/validated', isOrder, (c) => book(c.req.raw, c))
  app.post(
    '/read-bytes',
    async (c, next) => {
      await c.req.arrayBuffer()
      await next()
    },
    (c) => book(c.req.raw, c),
  )
  app.post(
    '/read-raw',
    async (c, next) => {
      // Read off the raw Request, which Hono does not cache.
      await c.req.raw.text()
      await next()
    },
    (c) => book(c.req.raw, c),
  )
  server = serve({ fetch: app.fetch, port: 0, hostname: '127.0.0.1' })
  await new Promise<void>((resolve) => server.once('listening', resolve))
  url = `http://127.0.0.1:${(server.address() as { port: number }).port}`
})
afterAll(async () => {
  await new Promise<void>((resolve) => server?.close(() => resolve()))
  await db?.drop()
})

const post = (path: string, key: string, body: string | Uint8Array) =>
  fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: body as BodyInit,
  })
const effects = async (cart: string) =>
  (await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [cart])).rows[0].n as number
const keyRows = async (key: string) =>
  (await db.pool.query('SELECT count(*)::int AS n FROM oncely.idempotency_keys WHERE key = $1', [key]))
    .rows[0].n as number

describe("Hono's validator('json') in front of an idempotent route", () => {
  it('runs once, hands on the body, and replays; another body under the key is 422', async () => {
    const key = freshKey()
    const before = runs
    const first = await post('/validated', key, JSON.stringify({ cart: key, amount: 3 }))
    expect(first.status).toBe(201)
    expect(await first.json()).toEqual({
      body: { cart: key, amount: 3 },
      validated: { cart: key, amount: 3 },
    })
    const replay = await post('/validated', key, JSON.stringify({ amount: 3, cart: key }))
    expect(replay.status).toBe(201)
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    const other = await post('/validated', key, JSON.stringify({ cart: key, amount: 4 }))
    expect(other.status).toBe(422)
    expect(runs - before).toBe(1)
    expect(await effects(key)).toBe(1)
  })

  it.each([
    ['duplicate member names', (cart: string) => `{"cart":"${cart}","cart":"${cart}-b","amount":1}`],
    ['an integer beyond 2^53', (cart: string) => `{"cart":"${cart}","amount":9007199254740993}`],
    ['a lone surrogate', (cart: string) => `{"cart":"${cart}\\ud800","amount":1}`],
  ])('%s, which the validator accepts: 400 invalid_json, and nothing is reserved', async (_, bodyFor) => {
    const key = freshKey()
    const res = await post('/validated', key, bodyFor(key))
    expect(res.status).toBe(400)
    expect(res.headers.get('content-type')).toBe('application/problem+json')
    expect(await res.json()).toMatchObject({ code: 'invalid_json' })
    expect(await keyRows(key)).toBe(0)
  })

  it.each([
    ['announced', false],
    ['chunked, so only the cached body tells its size', true],
  ])('a body over the limit, %s: 413, and nothing is reserved', async (_, chunked) => {
    const key = freshKey()
    const text = JSON.stringify({ cart: key, amount: 1, pad: 'x'.repeat(300) })
    const res = chunked
      ? await fetch(`${url}/validated`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': key },
          body: new Blob([text]).stream(),
          duplex: 'half',
        } as RequestInit)
      : await post('/validated', key, text)
    expect(res.status).toBe(413)
    expect(await res.json()).toMatchObject({ code: 'payload_too_large' })
    expect(await keyRows(key)).toBe(0)
  })
})

describe('other reads through c.req', () => {
  it('c.req.arrayBuffer() in front keeps the bytes, so they are checked as UTF-8 too', async () => {
    const key = freshKey()
    const ok = await post('/read-bytes', key, JSON.stringify({ cart: key, amount: 1 }))
    expect(ok.status).toBe(201)
    const invalid = await post(
      '/read-bytes',
      freshKey(),
      Buffer.concat([Buffer.from('{"cart":"a'), Buffer.from([0xff]), Buffer.from('","amount":1}')]),
    )
    expect(invalid.status).toBe(400)
    expect(await invalid.json()).toMatchObject({ code: 'invalid_json' })
  })

  it('a body read off the raw Request (not cached): 500 problem, and the log names the fix', async () => {
    const key = freshKey()
    const res = await post('/read-raw', key, JSON.stringify({ cart: key, amount: 1 }))
    expect(res.status).toBe(500)
    expect(res.headers.get('content-type')).toBe('application/problem+json')
    expect(errors.some((message) => /was read by another body parser.*c\.req/.test(message))).toBe(true)
    expect(await keyRows(key)).toBe(0)
  })
})
