// The HTTP surface of the Fastify adapter, through inject().
import type { TestDatabase } from '@oncely/test-support'
import type { FastifyInstance } from 'fastify'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { auth, buildApp } from './app.js'
import { countPayments, freshKey, setupDatabase } from './helpers.js'

let db: TestDatabase
let app: FastifyInstance
let events: Array<{ type: string }>
beforeAll(async () => {
  db = await setupDatabase('fastify')
  ;({ app, events } = await buildApp(db.pool, { maxResponseBytes: 4_096 }))
})
afterAll(async () => {
  await app.close()
  await db.drop()
})

const post = (key: string | undefined, body: unknown, headers: Record<string, string> = {}) =>
  app.inject({
    method: 'POST',
    url: '/v1/payments',
    headers: {
      ...auth(),
      'content-type': 'application/json',
      ...(key ? { 'idempotency-key': key } : {}),
      ...headers,
    },
    payload: typeof body === 'string' ? body : JSON.stringify(body),
  })

describe('replay', () => {
  it('answers a retry with the same status, bytes and safe headers, marked as a replay, without re-executing', async () => {
    const key = freshKey()
    const first = await post(key, { cart: key, amount: 100 })
    const second = await post(key, { amount: 100, cart: key, clientTime: 'later' })
    expect(first.statusCode).toBe(201)
    expect(first.headers['idempotent-replayed']).toBeUndefined()
    expect(second.statusCode).toBe(201)
    expect(second.rawPayload.equals(first.rawPayload)).toBe(true)
    expect(second.headers.location).toBe(first.headers.location)
    expect(second.headers.etag).toBe(first.headers.etag)
    expect(second.headers['content-type']).toBe(first.headers['content-type'])
    expect(second.headers['idempotent-replayed']).toBe('true')
    expect(second.headers['set-cookie']).toBeUndefined()
    expect(await countPayments(db.pool, 'tenant_1')).toBeGreaterThanOrEqual(1)
    const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [key])
    expect(rows[0].n).toBe(1)
  })

  it('replays a returned value (no reply.send) too', async () => {
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
  })

  it('stores and replays a permanent failure (402)', async () => {
    const key = freshKey()
    const first = await post(key, { cart: key, amount: 1, decline: true })
    const second = await post(key, { cart: key, amount: 1, decline: true })
    expect(first.statusCode).toBe(402)
    expect(first.json()).toMatchObject({ code: 'card_declined', message: 'Your card was declined.' })
    expect(second.statusCode).toBe(402)
    expect(second.rawPayload.equals(first.rawPayload)).toBe(true)
    expect(second.headers['idempotent-replayed']).toBe('true')
  })

  it('does not store a retryable failure: the retry executes', async () => {
    const key = freshKey()
    const first = await post(key, { cart: key, amount: 1, fail: 'throw' })
    expect(first.statusCode).toBe(504)
    const retry = await post(key, { cart: key, amount: 1, fail: 'throw' })
    expect(retry.statusCode).toBe(504) // executed again, not replayed
    expect(retry.headers['idempotent-replayed']).toBeUndefined()
    const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [key])
    expect(rows[0].n).toBe(0)
  })

  it('answers 500 response_too_large and stores nothing when the response exceeds the cap', async () => {
    const key = freshKey()
    const res = await post(key, { cart: key, amount: 1, big: 5_000 })
    expect(res.statusCode).toBe(500)
    expect(res.headers['content-type']).toBe('application/problem+json')
    expect(res.json()).toMatchObject({ code: 'response_too_large' })
    const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [key])
    expect(rows[0].n).toBe(0)
  })
})

describe('errors are problem+json, and nothing is reserved before the handler', () => {
  const reserved = async (key: string) =>
    (await db.pool.query('SELECT 1 FROM oncely.idempotency_keys WHERE key = $1', [key])).rowCount

  it.each([
    ['missing', undefined, 'idempotency_key_missing'],
    ['malformed', 'caf\u00e9', 'idempotency_key_malformed'],
    ['too long', 'k'.repeat(256), 'idempotency_key_too_long'],
    ['repeated', 'a, b', 'idempotency_key_repeated'],
  ])('rejects a %s key with 400 and its own code', async (_, key, code) => {
    const res = await post(key, { cart: 'c', amount: 1 }, { accept: 'text/html' })
    expect(res.statusCode).toBe(400)
    expect(res.headers['content-type']).toBe('application/problem+json')
    expect(res.json()).toMatchObject({ status: 400, code, type: `urn:oncely:problem:${code}` })
  })

  it('accepts the RFC 8941 quoted form as the same key', async () => {
    const key = freshKey()
    const first = await post(key, { cart: key, amount: 1 })
    const quoted = await post(`"${key}"`, { cart: key, amount: 1 })
    expect(quoted.headers['idempotent-replayed']).toBe('true')
    expect(quoted.rawPayload.equals(first.rawPayload)).toBe(true)
  })

  it.each([
    ['duplicate member names', '{"cart":"a","cart":"b","amount":1}'],
    ['an integer beyond 2^53', '{"cart":"a","amount":9007199254740993}'],
    ['broken JSON', '{"cart":'],
  ])('rejects %s with 400 invalid_json', async (_, body) => {
    const key = freshKey()
    const res = await post(key, body)
    expect(res.statusCode).toBe(400)
    expect(res.json()).toMatchObject({ code: 'invalid_json' })
    expect(await reserved(key)).toBe(0)
  })

  it('rejects a body over the route limit with 413', async () => {
    const key = freshKey()
    const res = await post(key, { cart: 'x'.repeat(2_000), amount: 1 })
    expect(res.statusCode).toBe(413)
    expect(res.json()).toMatchObject({ code: 'payload_too_large' })
    expect(await reserved(key)).toBe(0)
  })

  it.each(['text/plain', 'application/x-www-form-urlencoded'])('rejects %s with 415', async (type) => {
    const key = freshKey()
    const res = await post(key, 'cart=a&amount=1', { 'content-type': type })
    expect(res.statusCode).toBe(415)
    expect(res.json()).toMatchObject({ code: 'unsupported_media_type' })
    expect(await reserved(key)).toBe(0)
  })

  it('reserves nothing when auth rejects the request', async () => {
    const key = freshKey()
    const res = await app.inject({
      method: 'POST',
      url: '/v1/payments',
      headers: { 'idempotency-key': key },
      payload: { cart: 'a', amount: 1 },
    })
    expect(res.statusCode).toBe(401)
    expect(await reserved(key)).toBe(0)
  })

  it('answers 422 for a key reused with another payload, without echoing the stored response', async () => {
    const key = freshKey()
    await post(key, { cart: key, amount: 1 })
    const res = await post(key, { cart: key, amount: 2 })
    expect(res.statusCode).toBe(422)
    expect(res.json()).toMatchObject({ code: 'idempotency_key_reused' })
    expect(res.body).not.toContain(key)
    expect(events.some((e) => e.type === 'mismatch')).toBe(true)
  })

  it('scopes keys by tenant: another tenant with the same key executes its own request', async () => {
    const key = freshKey()
    const a = await post(key, { cart: key, amount: 1 })
    const b = await post(key, { cart: key, amount: 1 }, auth('tenant_2'))
    expect(a.statusCode).toBe(201)
    expect(b.statusCode).toBe(201)
    expect(b.headers['idempotent-replayed']).toBeUndefined()
    expect(b.json().id).not.toBe(a.json().id)
  })

  it('leaves GET routes untouched', async () => {
    const res = await app.inject({ method: 'GET', url: '/v1/payments', headers: auth() })
    expect(res.statusCode).toBe(200)
    expect(res.json()).toEqual({ list: [] })
  })
})

describe('store unavailable', () => {
  it('fails closed with 503 store_unavailable and Retry-After, without running the handler', async () => {
    const { buildApp: build } = await import('./app.js')
    const { postgresStore } = await import('../src/index.js')
    const broken = await build(db.pool, { store: postgresStore({ pool: db.pool, schema: 'missing_schema' }) })
    try {
      const key = freshKey()
      const res = await broken.app.inject({
        method: 'POST',
        url: '/v1/payments',
        headers: { ...auth('tenant_503'), 'idempotency-key': key },
        payload: { cart: key, amount: 1 },
      })
      expect(res.statusCode).toBe(503)
      expect(res.headers['retry-after']).toBe('1')
      expect(res.json()).toMatchObject({ code: 'store_unavailable' })
      expect(await countPayments(db.pool, 'tenant_503')).toBe(0)
    } finally {
      await broken.app.close()
    }
  })
})

describe('route configuration', () => {
  it('refuses failOpen on a route not marked naturally idempotent, naming the option and route', async () => {
    const { app: other } = await buildApp(db.pool)
    expect(() => other.post('/x', { config: { idempotency: { failOpen: true } } }, async () => ({}))).toThrow(
      /config\.idempotency\.failOpen.*POST \/x/,
    )
    await other.close()
  })
})
