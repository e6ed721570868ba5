import { randomUUID } from 'node:crypto'
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import type { FastifyInstance } from 'fastify'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { buildApp } from '../src/app.js'
import { prepareDatabase } from '../src/database.js'
import { createProvider } from '../src/provider.js'
import { count, pay, queuedRandom } from './support/app.js'
import { sendRaw } from './support/fuzz-requests.js'

let db: TestDatabase
let app: FastifyInstance
const draws = queuedRandom()

beforeAll(async () => {
  db = await createTestDatabase('payments_api')
  await prepareDatabase(db.pool)
  // failureRate 0.5: a queued draw below 0.25 fails before charging, below 0.5 after charging.
  const provider = createProvider({ pool: db.pool, failureRate: 0.5, random: draws.random })
  app = await buildApp({ pool: db.pool, provider, webRoot: false })
})
afterAll(async () => {
  await app?.close()
  await db?.drop()
})

const body = { amount: 1250, currency: 'eur', reference: 'order-17' }

describe('authentication', () => {
  it.each([
    ['missing', undefined],
    ['not a bearer token', 'Basic YWNtZTo='],
    ['a tenant with capitals', 'Bearer Acme'],
    ['a tenant longer than 64 characters', `Bearer ${'a'.repeat(65)}`],
  ])('answers 401 problem+json for %s credentials, before any key is reserved', async (_, authorization) => {
    const key = randomUUID()
    const res = await app.inject({
      method: 'POST',
      url: '/v1/payments',
      headers: { 'idempotency-key': key, ...(authorization ? { authorization } : {}) },
      payload: body,
    })
    expect(res.statusCode).toBe(401)
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/)
    expect(res.headers['www-authenticate']).toBe('Bearer')
    expect(res.json()).toMatchObject({ status: 401, code: 'unauthorized' })
    expect(await count(db.pool, 'oncely.idempotency_keys', ['key', key])).toBe(0)
  })
})

// The router decodes the path and takes an absolute-form target by its path, so every spelling of a route reaches
// it: authentication is decided on the route that matched, never on the raw URL.
describe('authentication, whatever the spelling of the path', () => {
  let origin: string
  let listening: FastifyInstance
  beforeAll(async () => {
    listening = await buildApp({ pool: db.pool, webRoot: false })
    await listening.listen({ port: 0, host: '127.0.0.1' })
    const { port } = listening.server.address() as { port: number }
    origin = `http://127.0.0.1:${port}`
  })
  afterAll(async () => {
    await listening?.close()
  })
  const raw = (method: string, path: string, headers: [string, string][], payload?: string) =>
    sendRaw(origin, { method, path, headers, body: payload, chunked: false, reuseKey: false })

  it.each([
    ['a percent-encoded path', (_: string) => '/%761/payments'],
    ['a percent-encoded segment', (_: string) => '/v1/%70ayments'],
    ['an absolute-form target', (host: string) => `${host}/v1/payments`],
    ['an absolute-form, percent-encoded target', (host: string) => `${host}/%761/payments`],
  ])('POST to %s without credentials: 401, and no key reserved', async (_, target) => {
    const key = randomUUID()
    const res = await raw(
      'POST',
      target(origin),
      [
        ['idempotency-key', key],
        ['content-type', 'application/json'],
      ],
      JSON.stringify(body),
    )
    expect(res.status).toBe(401)
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/)
    expect(JSON.parse(res.body.toString())).toMatchObject({ code: 'unauthorized' })
    expect(await count(db.pool, 'oncely.idempotency_keys', ['key', key])).toBe(0)
  })

  it.each([
    ['a percent-encoded path', (_: string) => '/%761/ledger'],
    ['an absolute-form target', (host: string) => `${host}/v1/ledger`],
  ])('GET the ledger through %s without credentials: 401', async (_, target) => {
    const res = await raw('GET', target(origin), [])
    expect(res.status).toBe(401)
  })

  it('the same spellings with credentials reach the route; the public routes need none', async () => {
    const res = await raw(
      'POST',
      `${origin}/%761/payments`,
      [
        ['authorization', 'Bearer acme'],
        ['idempotency-key', randomUUID()],
        ['content-type', 'application/json'],
      ],
      JSON.stringify(body),
    )
    expect(res.status).toBe(201)
    expect((await raw('GET', '/%68ealthz', [])).status).toBe(200)
    expect((await raw('GET', `${origin}/healthz`, [])).status).toBe(200)
  })
})

describe('validation', () => {
  it.each([
    ['no amount', { currency: 'eur' }],
    ['an amount as a string', { amount: '1250', currency: 'eur' }],
    ['a zero amount', { amount: 0, currency: 'eur' }],
    ['a fractional amount', { amount: 12.5, currency: 'eur' }],
    ['an uppercase currency', { amount: 1250, currency: 'EUR' }],
    ['an unknown member', { amount: 1250, currency: 'eur', tip: 5 }],
    ['a reference over 200 characters', { amount: 1250, currency: 'eur', reference: 'r'.repeat(201) }],
    ['an array', [1250]],
  ])('answers 400 invalid_request for %s, and reserves nothing', async (_, invalid) => {
    const key = randomUUID()
    const res = await pay(app, invalid, { key })
    expect(res.statusCode).toBe(400)
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/)
    expect(res.json()).toMatchObject({
      status: 400,
      code: 'invalid_request',
      type: 'urn:oncely:demo:problem:invalid_request',
    })
    expect(res.json().errors.length).toBeGreaterThan(0)
    expect(await count(db.pool, 'oncely.idempotency_keys', ['key', key])).toBe(0)
  })

  it('answers 400 invalid_json for a duplicate member name', async () => {
    const res = await pay(app, '{"amount":1250,"amount":99,"currency":"eur"}')
    expect(res.statusCode).toBe(400)
    expect(res.json()).toMatchObject({ code: 'invalid_json' })
  })

  // The reference below is the six characters \ud800 in the JSON text: a lone surrogate, which canonical JSON cannot
  // hold. It used to be reserved and booked with the reference turned into U+FFFD by Postgres' UTF-8 (a payment that
  // is not the one requested), and the corrected request with the same key was answered 422.
  it.each([
    ['a lone high surrogate', String.raw`{"amount":700,"currency":"eur","reference":"\ud800"}`],
    ['a lone low surrogate', String.raw`{"amount":700,"currency":"eur","reference":"order \udc00"}`],
  ])('answers 400 invalid_json for %s, reserves nothing, and the key then pays once', async (_, text) => {
    const key = randomUUID()
    const res = await pay(app, text, { key })
    expect(res.statusCode).toBe(400)
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/)
    expect(res.json()).toMatchObject({ status: 400, code: 'invalid_json' })
    expect(await count(db.pool, 'oncely.idempotency_keys', ['key', key])).toBe(0)
    const corrected = await pay(app, { amount: 700, currency: 'eur', reference: 'order-18' }, { key })
    expect(corrected.statusCode).toBe(201)
    expect(corrected.headers['idempotent-replayed']).toBeUndefined()
    expect(await count(db.pool, 'payments', ['idempotency_key', key])).toBe(1)
    expect(await count(db.pool, 'oncely.idempotency_keys', ['key', key])).toBe(1)
  })

  // JSON text is UTF-8. Decoded leniently, a reference holding the byte 0xff was booked as U+FFFD, and a retry with
  // 0xfe in its place was answered as a replay of that payment rather than 422.
  it.each([
    ['the byte 0xff', [0xff]],
    ['the byte 0xfe', [0xfe]],
    ['an encoded surrogate', [0xed, 0xa0, 0x80]],
  ])(
    'answers 400 invalid_json for a body holding %s (not UTF-8), reserves nothing, and the key then pays once',
    async (_, bytes) => {
      const key = randomUUID()
      const text = Buffer.concat([
        Buffer.from('{"amount":700,"currency":"eur","reference":"order '),
        Buffer.from(bytes),
        Buffer.from('"}'),
      ])
      const res = await pay(app, text, { key })
      expect(res.statusCode).toBe(400)
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/)
      expect(res.json()).toMatchObject({ status: 400, code: 'invalid_json' })
      expect(res.json().detail).toMatch(/UTF-8/)
      expect(await count(db.pool, 'oncely.idempotency_keys', ['key', key])).toBe(0)
      const corrected = await pay(app, { amount: 700, currency: 'eur', reference: 'order-18' }, { key })
      expect(corrected.statusCode).toBe(201)
      expect(corrected.headers['idempotent-replayed']).toBeUndefined()
      expect(await count(db.pool, 'payments', ['idempotency_key', key])).toBe(1)
      expect(await count(db.pool, 'oncely.idempotency_keys', ['key', key])).toBe(1)
    },
  )

  it('answers 400 idempotency_key_missing without an Idempotency-Key', async () => {
    const res = await app.inject({
      method: 'POST',
      url: '/v1/payments',
      headers: { authorization: 'Bearer acme' },
      payload: body,
    })
    expect(res.statusCode).toBe(400)
    expect(res.json()).toMatchObject({ code: 'idempotency_key_missing' })
  })
})

describe('POST /v1/payments', () => {
  it('creates a payment: 201, Location, the payment and its outbox event, one provider charge', async () => {
    const key = randomUUID()
    const res = await pay(app, body, { key })
    expect(res.statusCode).toBe(201)
    const payment = res.json()
    expect(payment).toEqual({
      id: expect.stringMatching(/^[0-9a-f-]{36}$/),
      amount: 1250,
      currency: 'eur',
      reference: 'order-17',
      status: 'succeeded',
      chargeId: expect.stringMatching(/^ch_/),
    })
    expect(res.headers.location).toBe(`/v1/payments/${payment.id}`)
    expect(res.headers['idempotent-replayed']).toBeUndefined()
    expect(await count(db.pool, 'payments', ['idempotency_key', key])).toBe(1)
    expect(await count(db.pool, 'outbox', ['aggregate_id', payment.id])).toBe(1)
    expect(await count(db.pool, 'provider_charges', ['charge_id', payment.chargeId])).toBe(1)

    const fetched = await app.inject({
      url: res.headers.location!,
      headers: { authorization: 'Bearer acme' },
    })
    expect(fetched.statusCode).toBe(200)
    expect(fetched.json()).toEqual(payment)
  })

  it('replays the stored response for the same key, with Idempotent-Replayed: true, charging once', async () => {
    const key = randomUUID()
    const first = await pay(app, body, { key })
    // Same request in another key order and spacing: canonically equal, so the same fingerprint.
    const again = await pay(app, '{ "reference": "order-17", "currency": "eur", "amount": 1250 }', { key })
    expect(again.statusCode).toBe(201)
    expect(again.headers['idempotent-replayed']).toBe('true')
    expect(again.headers.location).toBe(first.headers.location)
    expect(again.body).toBe(first.body)
    expect(await count(db.pool, 'payments', ['idempotency_key', key])).toBe(1)
    expect(await count(db.pool, 'provider_charges', ['charge_id', first.json().chargeId])).toBe(1)
  })

  it('answers 422 when the key is reused with another payload, and changes nothing', async () => {
    const key = randomUUID()
    await pay(app, body, { key })
    const res = await pay(app, { ...body, amount: 9999 }, { key })
    expect(res.statusCode).toBe(422)
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/)
    expect(res.json()).toMatchObject({ code: 'idempotency_key_reused' })
    expect(await count(db.pool, 'payments', ['idempotency_key', key])).toBe(1)
  })

  it('scopes keys to the tenant: the same key from two tenants is two payments', async () => {
    const key = randomUUID()
    const a = await pay(app, body, { key, tenant: 'tenant_a' })
    const b = await pay(app, body, { key, tenant: 'tenant_b' })
    expect([a.statusCode, b.statusCode]).toEqual([201, 201])
    expect(b.headers['idempotent-replayed']).toBeUndefined()
    expect(a.json().id).not.toBe(b.json().id)
  })

  it('stores a decline (402) and replays it without charging again', async () => {
    const key = randomUUID()
    const first = await pay(app, { amount: 1_000_001, currency: 'eur' }, { key })
    expect(first.statusCode).toBe(402)
    expect(first.headers['content-type']).toMatch(/^application\/problem\+json/)
    expect(first.json()).toMatchObject({
      status: 402,
      code: 'payment_declined',
      chargeId: expect.any(String),
    })
    const again = await pay(app, { amount: 1_000_001, currency: 'eur' }, { key })
    expect(again.statusCode).toBe(402)
    expect(again.headers['idempotent-replayed']).toBe('true')
    expect(again.body).toBe(first.body)
    expect(await count(db.pool, 'payments', ['idempotency_key', key])).toBe(0)
    expect(await count(db.pool, 'provider_charges', ['charge_id', first.json().chargeId])).toBe(1)
  })

  it('answers 503 with Retry-After when the provider fails before charging; the retry charges once', async () => {
    const key = randomUUID()
    draws.queue.push(0.1)
    const failed = await pay(app, body, { key, tenant: 'before_charge' })
    expect(failed.statusCode).toBe(503)
    expect(failed.headers['retry-after']).toBe('1')
    expect(failed.json()).toMatchObject({ code: 'provider_unavailable' })
    expect(await count(db.pool, 'provider_charges', ['tenant_id', 'before_charge'])).toBe(0)
    const retried = await pay(app, body, { key, tenant: 'before_charge' })
    expect(retried.statusCode).toBe(201)
    expect(retried.headers['idempotent-replayed']).toBeUndefined()
    expect(await count(db.pool, 'provider_charges', ['tenant_id', 'before_charge'])).toBe(1)
    expect(await count(db.pool, 'payments', ['tenant_id', 'before_charge'])).toBe(1)
  })

  it('answers 503 when the provider charged but its answer was lost; the retry re-executes and the provider dedupes', async () => {
    const key = randomUUID()
    draws.queue.push(0.4)
    const failed = await pay(app, body, { key, tenant: 'lost_answer' })
    expect(failed.statusCode).toBe(503)
    // Nothing stored: no payment, and the key is free to execute again.
    expect(await count(db.pool, 'payments', ['tenant_id', 'lost_answer'])).toBe(0)
    expect(await count(db.pool, 'provider_charges', ['tenant_id', 'lost_answer'])).toBe(1)
    const retried = await pay(app, body, { key, tenant: 'lost_answer' })
    expect(retried.statusCode).toBe(201)
    expect(retried.headers['idempotent-replayed']).toBeUndefined()
    expect(await count(db.pool, 'provider_charges', ['tenant_id', 'lost_answer'])).toBe(1)
    expect(await count(db.pool, 'payments', ['tenant_id', 'lost_answer'])).toBe(1)
  })
})

describe('GET /v1/payments/:id', () => {
  it("answers 404 for another tenant's payment and for an id that is not a uuid", async () => {
    const created = await pay(app, body, { tenant: 'owner' })
    const other = await app.inject({
      url: created.headers.location!,
      headers: { authorization: 'Bearer intruder' },
    })
    expect(other.statusCode).toBe(404)
    expect(other.headers['content-type']).toMatch(/^application\/problem\+json/)
    const junk = await app.inject({ url: '/v1/payments/nope', headers: { authorization: 'Bearer owner' } })
    expect(junk.statusCode).toBe(404)
    const anonymous = await app.inject({ url: created.headers.location! })
    expect(anonymous.statusCode).toBe(401)
  })
})

describe('a route that does not exist', () => {
  it.each([
    ['POST', '/v1/payments/00000000-0000-1000-8000-000000000000'],
    ['PUT', '/v1/payments'],
    ['GET', '/v1/unknown'],
    ['DELETE', '/nowhere'],
  ] as const)(
    '%s %s: 404 problem+json, like every other error, and reserves nothing',
    async (method, url) => {
      const key = randomUUID()
      const res = await app.inject({
        method,
        url,
        headers: { authorization: 'Bearer acme', 'idempotency-key': key, 'content-type': 'application/json' },
        payload: JSON.stringify(body),
      })
      expect(res.statusCode).toBe(404)
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/)
      expect(res.json()).toMatchObject({
        status: 404,
        code: 'not_found',
        type: 'urn:oncely:demo:problem:not_found',
      })
      expect(await count(db.pool, 'oncely.idempotency_keys', ['key', key])).toBe(0)
    },
  )
})

describe('a URL Fastify cannot decode', () => {
  it.each(['/v1/payments/%ZZ', '/nowhere/%C0'])('%s: 400 problem+json, and reserves nothing', async (url) => {
    const key = randomUUID()
    const res = await app.inject({
      method: 'POST',
      url,
      headers: { authorization: 'Bearer acme', 'idempotency-key': key, 'content-type': 'application/json' },
      payload: JSON.stringify(body),
    })
    expect(res.statusCode).toBeGreaterThanOrEqual(400)
    expect(res.statusCode).toBeLessThan(500)
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/)
    expect(res.json()).toMatchObject({ status: res.statusCode })
    expect(await count(db.pool, 'oncely.idempotency_keys', ['key', key])).toBe(0)
  })
})

describe('a message Node cannot parse as HTTP', () => {
  // Refused by the HTTP parser before Fastify routes anything (inject() never gets there): a real socket.
  it.each<[string, string, [string, string][], number]>([
    ['a control character in a header value', 'POST', [['idempotency-key', 'a\u0001b']], 400],
    ['an unknown method', 'FOO', [], 400],
    ['a header section over 16 KiB', 'POST', [['x-padding', 'p'.repeat(20_000)]], 431],
  ])('%s: problem+json too', async (_, method, headers, status) => {
    const served = await buildApp({ pool: db.pool, webRoot: false })
    try {
      const origin = await served.listen({ port: 0, host: '127.0.0.1' })
      const res = await sendRaw(origin, {
        method,
        path: '/v1/payments',
        headers: [['authorization', 'Bearer acme'], ...headers],
        body: undefined,
        chunked: false,
        reuseKey: false,
      })
      expect(res.status).toBe(status)
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/)
      expect(JSON.parse(res.body.toString())).toMatchObject({ status })
    } finally {
      await served.close()
    }
  })
})

describe('GET /healthz', () => {
  it('answers 200 when the database answers', async () => {
    const res = await app.inject({ url: '/healthz' })
    expect(res.statusCode).toBe(200)
    expect(res.json()).toEqual({ status: 'ok' })
  })
})
