import { HttpResponse, http } from 'msw'
import { setupServer } from 'msw/node'
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest'
import {
  createClient,
  HTTPError,
  IdempotencyKeyReusedError,
  type IntentRecord,
  type IntentStore,
  isIntentExpiredError,
  memoryStore,
  QuotaExceededError,
} from '../src/index.js'
import { deriveKey, randomKey } from '../src/keys.js'

const BASE = 'http://api.test'
const server = setupServer()
const seen: { key: string | null; headers: Headers; body: string; raw: number[] }[] = []
let replies: Record<string, { status: number; data: { n: number } }> = {}

beforeAll(() => server.listen({ onUnhandledRequest: 'error' }))
beforeEach(() => {
  seen.length = 0
  replies = {}
  server.use(
    http.all(`${BASE}/*`, async ({ request }) => {
      const key = request.headers.get('idempotency-key')
      const raw = new Uint8Array(await request.arrayBuffer())
      seen.push({ key, headers: request.headers, body: new TextDecoder().decode(raw), raw: [...raw] })
      const stored = key ? replies[key] : undefined
      if (stored)
        return HttpResponse.json(stored.data, {
          status: stored.status,
          headers: { 'idempotent-replayed': 'true' },
        })
      const data = { n: seen.length }
      if (key) replies[key] = { status: 201, data }
      return HttpResponse.json(data, { status: 201 })
    }),
  )
})
afterEach(() => {
  server.resetHandlers()
  vi.unstubAllGlobals()
})
afterAll(() => server.close())

const make = (overrides: Partial<Parameters<typeof createClient>[0]> = {}) =>
  createClient({ baseUrl: BASE, store: memoryStore(), resumeOnOnline: false, ...overrides })

describe('write-ahead', () => {
  it('records the intent, without secrets, before the first byte is sent', async () => {
    const inner = memoryStore()
    let release!: () => void
    const gate = new Promise<void>((resolve) => {
      release = resolve
    })
    const written: IntentRecord[] = []
    const store: IntentStore = {
      ...inner,
      async set(record) {
        if (written.length === 0) await gate
        written.push(record)
        await inner.set(record)
      },
    }
    const client = make({ store, headers: async () => ({ 'x-session': 'from-fn' }) })
    const running = client.request({
      path: '/v1/payments',
      json: { amount: 1 },
      headers: { authorization: 'Bearer secret', cookie: 'a=b', 'x-tenant': 't1' },
    })
    await new Promise((resolve) => setTimeout(resolve, 50))
    expect(seen).toHaveLength(0) // the write has not resolved, so nothing went out
    release()
    const res = await running
    expect(seen).toHaveLength(1)
    expect(seen[0]!.headers.get('authorization')).toBe('Bearer secret')
    expect(seen[0]!.headers.get('x-session')).toBe('from-fn')
    expect(written[0]).toMatchObject({
      key: res.key,
      method: 'POST',
      url: `${BASE}/v1/payments`,
      body: { encoding: 'utf8', data: '{"amount":1}' },
      headers: { 'content-type': 'application/json', 'x-tenant': 't1' },
      state: 'pending',
      attempts: 1, // the write-ahead record counts the first attempt: one write before the first byte
      version: 1,
    })
    expect(JSON.stringify(written)).not.toMatch(/secret|a=b|from-fn/)
  })

  it('records and sends nothing for a signal aborted before the call', async () => {
    const store = memoryStore()
    const reason = new Error('already cancelled')
    await expect(
      make({ store }).request({ path: '/v1/payments', json: {}, signal: AbortSignal.abort(reason) }),
    ).rejects.toBe(reason)
    expect(await store.list()).toEqual([])
    expect(seen).toHaveLength(0)
  })

  it('sends nothing when the store cannot record the intent', async () => {
    const store: IntentStore = {
      ...memoryStore(),
      async set() {
        throw new QuotaExceededError('full')
      },
    }
    await expect(make({ store }).request({ path: '/v1/payments', json: {} })).rejects.toBeInstanceOf(
      QuotaExceededError,
    )
    expect(seen).toHaveLength(0)
  })
})

describe('failures that are not answers', () => {
  it('keeps the intent pending when the headers option throws, and sends nothing', async () => {
    const client = make({
      headers: () => {
        throw new Error('token refresh failed')
      },
    })
    await expect(client.request({ path: '/v1/payments', json: {} })).rejects.toThrow('token refresh failed')
    expect(seen).toHaveLength(0)
    expect(await client.pending()).toMatchObject([{ state: 'pending', attempts: 1 }])
  })

  it('stops at once (no retry) when the store fails between attempts', async () => {
    const inner = memoryStore()
    let writes = 0
    const store: IntentStore = {
      ...inner,
      async set(record) {
        if (++writes > 2) throw new QuotaExceededError('full')
        await inner.set(record)
      },
    }
    let sends = 0
    server.use(
      http.post(`${BASE}/v1/flaky`, () => {
        sends++
        return new HttpResponse(null, { status: 503 })
      }),
    )
    const client = make({ store, retry: { minDelayMs: 1 } })
    await expect(client.request({ path: '/v1/flaky', json: {} })).rejects.toBeInstanceOf(QuotaExceededError)
    expect(writes).toBe(3) // write-ahead (attempt 1), its error, then the failing write of attempt 2
    expect(sends).toBe(1) // attempt 2 was never sent
  })
})

describe('intentId', () => {
  it('returns a stored 4xx as the same error for the same intentId, without sending again', async () => {
    server.use(
      http.post(`${BASE}/v1/declined`, () =>
        HttpResponse.json({ title: 'Card declined', status: 402, code: 'card_declined' }, { status: 402 }),
      ),
    )
    const client = make()
    const call = () => client.request({ path: '/v1/declined', json: { amount: 5 }, intentId: 'order:9' })
    const first = await call().catch((e) => e)
    const second = await call().catch((e) => e)
    expect(first).toBeInstanceOf(HTTPError)
    expect(second).toBeInstanceOf(HTTPError)
    expect(second).toMatchObject({ status: 402, problem: { code: 'card_declined' } })
  })

  it('retryFailed: a new try after a recorded decline, reported to onIntent with its own key', async () => {
    server.use(
      http.post(`${BASE}/v1/declined`, async ({ request }) => {
        const { card } = (await request.json()) as { card: string }
        seen.push({
          key: request.headers.get('idempotency-key'),
          headers: request.headers,
          body: card,
          raw: [],
        })
        return card === 'bad'
          ? HttpResponse.json({ title: 'Card declined', status: 402 }, { status: 402 })
          : HttpResponse.json({ ok: true }, { status: 201 })
      }),
    )
    const client = make()
    const reported: string[] = []
    const call = (card: string) =>
      client.request({
        path: '/v1/declined',
        json: { card },
        intentId: 'order:10',
        retryFailed: true,
        onIntent: ({ key }) => reported.push(key),
      })
    await expect(call('bad')).rejects.toMatchObject({ status: 402 })
    const paid = await call('good')
    expect(seen.map((s) => [s.body, s.key])).toEqual([
      ['bad', reported[0]],
      ['good', paid.key],
    ])
    expect(paid.key).not.toBe(reported[0])
    expect(reported).toEqual([reported[0], reported[0], paid.key]) // the second call: first key, then its try's
    await expect(client.request({ path: '/x', retryFailed: 'yes' as never })).rejects.toThrow(
      'Expected `retryFailed` to be a boolean',
    )
  })

  it('retryFailed never starts a new try after a 422: the other bytes may have succeeded', async () => {
    server.use(
      http.post(`${BASE}/v1/reused`, ({ request }) => {
        seen.push({
          key: request.headers.get('idempotency-key'),
          headers: request.headers,
          body: '',
          raw: [],
        })
        return HttpResponse.json({ title: 'reused', status: 422 }, { status: 422 })
      }),
    )
    const client = make()
    const call = () =>
      client.request({ path: '/v1/reused', json: { card: 'b' }, intentId: 'order:11', retryFailed: true })
    await expect(call()).rejects.toBeInstanceOf(IdempotencyKeyReusedError)
    await expect(call()).rejects.toBeInstanceOf(IdempotencyKeyReusedError)
    expect(seen).toHaveLength(1)
  })

  it('resumes intents left by a previous run when created with resumeOnStart', async () => {
    const store = memoryStore()
    await store.set({
      format: 1,
      id: 'left-over',
      key: 'left-over-key',
      method: 'POST',
      url: `${BASE}/v1/payments`,
      headers: {},
      createdAt: Date.now(),
      expiresAt: Date.now() + 60_000,
      attempts: 2,
      version: 4,
      state: 'pending',
    })
    const client = make({ store, resumeOnStart: true })
    const settled = await new Promise((resolve) => client.on('settled', resolve))
    expect(settled).toMatchObject({ id: 'left-over', key: 'left-over-key', attempts: 3 })
    expect(seen.map((s) => [s.key, s.headers.get('oncely-attempt')])).toEqual([['left-over-key', '3']])
  })

  it('derives the same key from the same business fact, and another for another target', () => {
    const a = deriveKey('checkout:cart_42', 'POST', `${BASE}/v1/payments`)
    expect(deriveKey('checkout:cart_42', 'POST', `${BASE}/v1/payments`)).toBe(a)
    expect(a).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
    expect(deriveKey('checkout:cart_42', 'POST', `${BASE}/v1/refunds`)).not.toBe(a)
    expect(deriveKey('checkout:cart_43', 'POST', `${BASE}/v1/payments`)).not.toBe(a)
  })

  it('joins a second call while pending and returns the settled outcome afterwards without sending', async () => {
    const client = make()
    const call = () =>
      client.request({ path: '/v1/payments', json: { amount: 5 }, intentId: 'checkout:cart_42' })
    const [a, b] = await Promise.all([call(), call()])
    expect(seen).toHaveLength(1)
    expect(b).toEqual(a)
    const again = await call()
    expect(seen).toHaveLength(1)
    expect(again).toMatchObject({ status: 201, data: a.data, key: a.key })
  })

  it('says where each answer came from: the network, a server replay, or the local store', async () => {
    const store = memoryStore()
    const events: string[] = []
    const client = make({ store })
    client.on('settled', (e) => events.push(`${e.source} replayed=${e.replayed}`))
    const call = () => client.request({ path: '/v1/payments', json: { amount: 5 }, intentId: 'order:8' })
    const first = await call()
    expect(first).toMatchObject({ source: 'network', replayed: false })
    expect(await call()).toMatchObject({ source: 'store', replayed: false, data: first.data })
    expect(seen).toHaveLength(1)
    // Forgotten locally (another device, or after settledTtlMs): the server answers from its stored response.
    await store.delete('order:8')
    const replayed = await call()
    expect(replayed).toMatchObject({ source: 'replay', replayed: true, data: first.data })
    expect(await call()).toMatchObject({ source: 'store', replayed: true })
    expect(seen).toHaveLength(2)
    expect(events).toEqual(['network replayed=false', 'replay replayed=true'])
  })

  it('keeps a settled outcome without set-cookie or any hop-by-hop header', async () => {
    server.use(
      http.post(`${BASE}/v1/orders`, () =>
        HttpResponse.json(
          { id: 'o1' },
          {
            status: 201,
            headers: {
              connection: 'keep-alive, x-trace-hop',
              'keep-alive': 'timeout=5',
              'x-trace-hop': 'proxy-1',
              'transfer-encoding': 'chunked',
              'set-cookie': 'session=secret',
              location: '/v1/orders/o1',
            },
          },
        ),
      ),
    )
    const store = memoryStore()
    const client = make({ store })
    await client.request({ path: '/v1/orders', json: {}, intentId: 'order:9' })
    const kept = (await store.get('order:9'))!.outcome!
    expect(Object.keys(kept.headers)).toEqual(expect.arrayContaining(['content-type', 'location']))
    for (const name of ['connection', 'keep-alive', 'x-trace-hop', 'transfer-encoding', 'set-cookie']) {
      expect(kept.headers).not.toHaveProperty(name)
    }
    const again = await client.request({ path: '/v1/orders', json: {}, intentId: 'order:9' })
    expect(again.source).toBe('store')
    expect(again.headers.get('location')).toBe('/v1/orders/o1')
  })

  it('after settledTtlMs, sends again with the same key (the server replays)', async () => {
    let now = 1_000_000
    const timers = {
      now: () => now,
      setTimeout: globalThis.setTimeout,
      clearTimeout: globalThis.clearTimeout,
    }
    const client = make({ settledTtlMs: 1000, timers: timers as never })
    const call = () => client.request({ path: '/v1/payments', json: { amount: 5 }, intentId: 'order:7' })
    const first = await call()
    now += 1001
    const second = await call()
    expect(seen.map((s) => s.key)).toEqual([first.key, first.key])
    expect(second).toMatchObject({ replayed: true, data: first.data })
  })

  it('refuses the same intentId with a different body, while in flight or settled, without sending', async () => {
    const client = make()
    const inFlight = client.request({ path: '/v1/payments', json: { amount: 5 }, intentId: 'x' })
    await expect(
      client.request({ path: '/v1/payments', json: { amount: 9 }, intentId: 'x' }),
    ).rejects.toBeInstanceOf(IdempotencyKeyReusedError)
    await inFlight
    await client.request({ path: '/v1/payments', json: { amount: 5 }, intentId: 'x' })
    await expect(
      client.request({ path: '/v1/payments', json: { amount: 6 }, intentId: 'x' }),
    ).rejects.toBeInstanceOf(IdempotencyKeyReusedError)
    expect(seen).toHaveLength(1)
  })
})

describe('expiry', () => {
  it('never resends an intent older than intentTtlMs: it expires, stays listed, and can be discarded', async () => {
    let now = 0
    const timers = {
      now: () => now,
      setTimeout: globalThis.setTimeout,
      clearTimeout: globalThis.clearTimeout,
    }
    const store = memoryStore()
    const client = make({ store, timers: timers as never, intentTtlMs: 60_000 })
    const expired: unknown[] = []
    client.on('expired', (event) => expired.push(event))
    const record: IntentRecord = {
      format: 1,
      id: 'k1',
      key: 'k1',
      method: 'POST',
      url: `${BASE}/v1/payments`,
      headers: {},
      createdAt: 0,
      expiresAt: 60_000,
      attempts: 1,
      version: 3,
      state: 'pending',
    }
    await store.set(record)
    now = 60_000
    const [outcome] = await client.resume()
    expect(outcome?.outcome).toBe('failed')
    expect(isIntentExpiredError((outcome as { error: unknown }).error)).toBe(true)
    expect(seen).toHaveLength(0)
    expect(expired).toEqual([{ id: 'k1', key: 'k1', createdAt: 0, expiresAt: 60_000 }])
    expect(await client.pending()).toMatchObject([{ id: 'k1', state: 'expired' }])
    expect(await client.resume()).toEqual([])
    await client.discard('k1')
    expect(await client.pending()).toEqual([])
  })
})

describe('bodies', () => {
  it('stores and sends strings, URLSearchParams, bytes and FormData without files byte for byte', async () => {
    const client = make()
    await client.request({ path: '/a', body: new URLSearchParams({ a: '1', b: 'x y' }) })
    await client.request({ path: '/b', body: new Uint8Array([0, 255, 10]) })
    await client.request({ path: '/c', body: new Uint16Array([1]).buffer })
    const form = new FormData()
    form.set('note', 'hi')
    await client.request({ path: '/d', body: form })
    await client.request({ path: '/e', body: 'plain' })
    expect(seen[0]).toMatchObject({ body: 'a=1&b=x+y' })
    expect(seen[0]!.headers.get('content-type')).toContain('application/x-www-form-urlencoded')
    expect(seen[1]!.raw).toEqual([0, 255, 10])
    expect(seen[2]!.raw).toEqual([...new Uint8Array(new Uint16Array([1]).buffer)])
    expect(seen[3]!.headers.get('content-type')).toMatch(/^multipart\/form-data; boundary=/)
    expect(seen[3]!.body).toContain('name="note"')
    expect(seen[4]!.body).toBe('plain')
  })

  it('rejects bodies that cannot be replayed with a TypeError naming the problem', async () => {
    const client = make()
    const form = new FormData()
    form.set('file', new Blob(['x']), 'x.txt')
    await expect(client.request({ path: '/a', body: form })).rejects.toThrow(
      /FormData field "file" holds a Blob/,
    )
    await expect(client.request({ path: '/a', body: new ReadableStream() as never })).rejects.toThrow(
      TypeError,
    )
    await expect(client.request({ path: '/a', json: {}, body: 'x' })).rejects.toThrow(
      /either `json` or `body`/,
    )
    expect(seen).toHaveLength(0)
  })
})

describe('keys', () => {
  const V7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/

  it('mints unique version 7 UUIDs that sort by time, with the milliseconds in their first 48 bits', () => {
    const keys = Array.from({ length: 1_000 }, (_, i) => randomKey(1_796_000_000_000 + i))
    expect(new Set(keys).size).toBe(1_000)
    for (const key of keys) expect(key).toMatch(V7)
    expect([...keys].sort()).toEqual(keys)
    const ms = (key: string) => Number.parseInt(key.replace(/-/g, '').slice(0, 12), 16)
    expect(ms(keys[0]!)).toBe(1_796_000_000_000)
    // Until the year 10889 the time fits its 48 bits.
    expect(ms(randomKey(2 ** 48 - 1))).toBe(2 ** 48 - 1)
    expect(randomKey()).toMatch(V7)
  })

  it('needs only getRandomValues (crypto.randomUUID is missing on insecure origins and old Hermes)', () => {
    const real = globalThis.crypto
    vi.stubGlobal('crypto', { getRandomValues: (a: Uint8Array) => real.getRandomValues(a) })
    const keys = new Set(Array.from({ length: 100 }, () => randomKey()))
    expect(keys.size).toBe(100)
    for (const key of keys) expect(key).toMatch(V7)
  })
})

describe('options', () => {
  it('rejects bad options with a TypeError naming them', () => {
    expect(() => createClient({ baseUrl: '/relative' })).toThrow(/`baseUrl`/)
    expect(() => make({ retry: { limit: -1 } })).toThrow(/`retry.limit`/)
    expect(() => make({ retry: { limit: 1.5 } })).toThrow(/`retry.limit`/)
    expect(() => make({ retry: { maxDelayMs: Number.NaN } })).toThrow(/`retry.maxDelayMs`/)
    expect(() => make({ intentTtlMs: 0 })).toThrow(/`intentTtlMs`/)
    expect(() => make({ store: {} as never })).toThrow(/`store.get`/)
    expect(() => make({ headers: 'x' as never })).toThrow(/`headers`/)
    expect(() => make({ timers: { now: Date.now } as never })).toThrow(/`timers.setTimeout`/)
    expect(() => make({ resumeOnStart: 'yes' as never })).toThrow(/`resumeOnStart`/)
    expect(() => make({ timeoutMs: 0 })).toThrow(/`timeoutMs`/)
  })

  it('reports every bad option at once, not only the first', () => {
    const error = (() => {
      try {
        createClient({ baseUrl: 'nope', retry: { limit: -1 }, timeoutMs: 0, headers: 1 as never })
      } catch (caught) {
        return caught
      }
    })()
    expect(error).toBeInstanceOf(TypeError)
    const message = (error as Error).message
    expect(message).toMatch(/^createClient: 4 invalid options/)
    for (const name of ['baseUrl', 'retry.limit', 'timeoutMs', 'headers'])
      expect(message).toContain(`\`${name}\``)
  })

  it('mutation() binds an endpoint and reports attempt then settled events', async () => {
    const client = make()
    const events: string[] = []
    client.on('attempt', (e) => events.push(`attempt ${e.attempt}`))
    client.on('settled', (e) => events.push(`settled ${e.status}`))
    const createPayment = client.mutation<{ amount: number }, { n: number }>({
      method: 'PUT',
      path: '/v1/payments/p1',
    })
    const res = await createPayment({ amount: 3 })
    expect(res.data.n).toBe(1)
    expect(events).toEqual(['attempt 1', 'settled 201'])
    expect(seen[0]!.body).toBe('{"amount":3}')
  })
})
