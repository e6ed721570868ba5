import { HttpResponse, http } from 'msw'
import { setupServer } from 'msw/node'
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest'
import {
  type ClientEvents,
  createClient,
  HTTPError,
  IdempotencyKeyReusedError,
  isNetworkError,
  isRetryExhaustedError,
  memoryStore,
  type OncelyClient,
  RetryExhaustedError,
} from '../src/index.js'
import { errorOf, runToEnd } from './helpers.js'

const BASE = 'http://api.test'
const server = setupServer()
type Reply = (attempt: number, request: Request) => Response | Promise<Response>
const seen: { key: string | null; attempt: string | null; at: number; body: string }[] = []

function serve(reply: Reply) {
  server.use(
    http.post(`${BASE}/v1/payments`, async ({ request }) => {
      seen.push({
        key: request.headers.get('idempotency-key'),
        attempt: request.headers.get('oncely-attempt'),
        at: Date.now(),
        body: await request.clone().text(),
      })
      return reply(seen.length, request)
    }),
  )
}

function client(overrides: Partial<Parameters<typeof createClient>[0]> = {}) {
  const store = overrides.store ?? memoryStore()
  const c = createClient({ baseUrl: BASE, store, random: () => 0.5, resumeOnOnline: false, ...overrides })
  const retries: ClientEvents['retry'][] = []
  c.on('retry', (event) => retries.push(event))
  return { client: c, store, retries }
}

const pay = (c: OncelyClient, extra: Partial<Parameters<OncelyClient['request']>[0]> = {}) =>
  c.request({ method: 'POST', path: '/v1/payments', json: { amount: 100 }, ...extra })

beforeAll(() => server.listen({ onUnhandledRequest: 'error' }))
beforeEach(() => {
  seen.length = 0
  vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'Date'] })
})
afterEach(() => {
  server.resetHandlers()
  vi.useRealTimers()
})
afterAll(() => server.close())

describe('retry rules', () => {
  it('sends one key and an attempt counter, and settles on the first success', async () => {
    serve(() => HttpResponse.json({ id: 'pay_1' }, { status: 201 }))
    const { client: c, store } = client()
    const res = await pay(c)
    expect(res).toMatchObject({ status: 201, data: { id: 'pay_1' }, replayed: false, attempts: 1 })
    expect(res.key).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
    expect(seen).toEqual([{ key: res.key, attempt: '1', at: expect.any(Number), body: '{"amount":100}' }])
    expect(await store.list()).toEqual([])
  })

  it('retries 500, 502, 503, 504, 408, 429 and 409 with the same key', async () => {
    const statuses = [500, 502, 503, 504, 408, 429, 409]
    serve((n) =>
      n <= statuses.length ? new HttpResponse(null, { status: statuses[n - 1] }) : HttpResponse.json({}),
    )
    const { client: c } = client()
    const outcome = await runToEnd(pay(c))
    expect(outcome.ok).toBe(true)
    expect(seen.map((s) => s.attempt)).toEqual(['1', '2', '3', '4', '5', '6', '7', '8'])
    expect(new Set(seen.map((s) => s.key)).size).toBe(1)
  })

  it('retries network errors, as every runtime words them', async () => {
    serve((n) => (n < 3 ? HttpResponse.error() : HttpResponse.json({ ok: true })))
    const { client: c, retries } = client()
    const outcome = await runToEnd(pay(c))
    expect(outcome.ok).toBe(true)
    expect(retries.map((r) => r.reason)).toEqual(['network', 'network'])
    expect(isNetworkError(retries[0]!.error)).toBe(true)
  })

  it('retries an attempt that timed out', async () => {
    serve((n) => (n === 1 ? new Promise<Response>(() => {}) : HttpResponse.json({ ok: true })))
    const { client: c, retries } = client({ timeoutMs: 1000 })
    const outcome = await runToEnd(pay(c))
    expect(outcome.ok).toBe(true)
    expect(retries[0]?.error).toMatchObject({ name: 'NetworkError', timedOut: true })
  })

  it('never retries 422: throws IdempotencyKeyReusedError with the problem and settles the intent', async () => {
    const problem = { type: 'urn:oncely:problem:idempotency_key_reused', title: 'reused', status: 422 }
    serve(() =>
      HttpResponse.json(problem, { status: 422, headers: { 'content-type': 'application/problem+json' } }),
    )
    const { client: c, store } = client()
    const error = errorOf(await runToEnd(pay(c)))
    expect(error).toBeInstanceOf(IdempotencyKeyReusedError)
    expect(error).toMatchObject({ status: 422, problem })
    expect(seen).toHaveLength(1)
    expect(await store.list()).toEqual([])
  })

  it.each([400, 401, 403, 404, 413])('never retries %i: throws HTTPError', async (status) => {
    serve(() => HttpResponse.json({ title: 'no', status }, { status }))
    const { client: c } = client()
    const error = errorOf(await runToEnd(pay(c)))
    expect(error).toBeInstanceOf(HTTPError)
    expect(error).not.toBeInstanceOf(IdempotencyKeyReusedError)
    expect(error).toMatchObject({ status, problem: { status } })
    expect(seen).toHaveLength(1)
  })

  it('waits Retry-After delta-seconds on 429 before the next attempt', async () => {
    serve((n) =>
      n === 1
        ? new HttpResponse(null, { status: 429, headers: { 'retry-after': '7' } })
        : HttpResponse.json({}),
    )
    const { client: c, retries } = client()
    await runToEnd(pay(c), 50)
    expect(retries[0]).toMatchObject({ delayMs: 7000, retryAfter: true, reason: 'status 429' })
    expect(seen[1]!.at - seen[0]!.at).toBeGreaterThanOrEqual(7000)
    expect(seen[1]!.at - seen[0]!.at).toBeLessThan(7200)
  })

  it('measures a Retry-After HTTP-date against the response Date header, not a wrong client clock', async () => {
    vi.setSystemTime(new Date('2030-01-01T12:00:00Z')) // client clock one hour ahead of the server
    serve((n) =>
      n === 1
        ? new HttpResponse(null, {
            status: 503,
            headers: {
              date: 'Tue, 01 Jan 2030 11:00:00 GMT',
              'retry-after': 'Tue, 01 Jan 2030 11:00:05 GMT',
            },
          })
        : HttpResponse.json({}),
    )
    const { client: c, retries } = client()
    await runToEnd(pay(c))
    expect(retries[0]).toMatchObject({ delayMs: 5000, retryAfter: true })
  })

  it('caps Retry-After at maxRetryAfterMs, and honours it only on 409, 429 and 503', async () => {
    serve((n) =>
      n === 1
        ? new HttpResponse(null, { status: 409, headers: { 'retry-after': '3600' } })
        : n === 2
          ? new HttpResponse(null, { status: 500, headers: { 'retry-after': '3600' } })
          : HttpResponse.json({}),
    )
    const { client: c, retries } = client({ retry: { maxRetryAfterMs: 10_000, minDelayMs: 100 } })
    await runToEnd(pay(c))
    expect(retries.map((r) => [r.delayMs, r.retryAfter])).toEqual([
      [10_000, true],
      [50, false], // full jitter: 0.5 * min(maxDelay, 100 * 2^0), the first retry the client paces itself
    ])
  })

  it('backs off with full jitter: random(0, min(maxDelayMs, minDelayMs * 2^n))', async () => {
    serve((n) => (n <= 6 ? new HttpResponse(null, { status: 503 }) : HttpResponse.json({})))
    const { client: c, retries } = client({
      random: () => 0.999,
      retry: { minDelayMs: 100, maxDelayMs: 1000 },
    })
    await runToEnd(pay(c))
    expect(retries.map((r) => r.delayMs)).toEqual([99, 199, 399, 799, 999, 999])
  })

  it('gives up after retry.limit retries with every attempt error, and keeps the intent pending', async () => {
    serve((n) => (n % 2 ? new HttpResponse(null, { status: 502 }) : HttpResponse.error()))
    const { client: c, store } = client({ retry: { limit: 3 } })
    const error = errorOf(await runToEnd(pay(c)))
    expect(error).toBeInstanceOf(RetryExhaustedError)
    const exhausted = error as RetryExhaustedError
    expect(exhausted.errors.map((e) => e.name)).toEqual([
      'HTTPError',
      'NetworkError',
      'HTTPError',
      'NetworkError',
    ])
    expect(exhausted.errors[0]).toMatchObject({ status: 502 })
    expect((exhausted.errors[1] as Error).cause).toMatchObject({
      name: 'TypeError',
      message: 'Failed to fetch',
    })
    expect(exhausted.cause).toBe(exhausted.errors[3])
    expect(seen).toHaveLength(4)
    const [pending] = await c.pending()
    expect(pending).toMatchObject({
      key: seen[0]!.key,
      attempts: 4,
      state: 'pending',
      lastError: { name: 'NetworkError' },
    })
    expect(await store.list()).toHaveLength(1)
  })

  it('gives up when the next wait would pass maxElapsedMs', async () => {
    serve(() => new HttpResponse(null, { status: 503 }))
    const { client: c } = client({
      random: () => 0.999,
      retry: { minDelayMs: 1000, maxDelayMs: 1000, maxElapsedMs: 3500 },
    })
    const error = errorOf(await runToEnd(pay(c)))
    expect(isRetryExhaustedError(error)).toBe(true)
    expect((error as Error).message).toContain('maxElapsedMs')
    expect(seen).toHaveLength(4) // waits of 999 ms: 3 fit in 3500 ms, the 4th would not
  })

  it('waits the server asks for do not use up retry.limit: 409s with Retry-After go on until the answer', async () => {
    // A duplicate of a long request: the server says "in progress, ask again in 1 s" twelve times.
    serve((n) =>
      n <= 12
        ? HttpResponse.json(
            { type: 'urn:oncely:problem:request_in_progress', title: 'in progress', status: 409 },
            { status: 409, headers: { 'retry-after': '1', 'content-type': 'application/problem+json' } },
          )
        : HttpResponse.json({ id: 'pay_1' }, { status: 201, headers: { 'idempotent-replayed': 'true' } }),
    )
    const { client: c, retries } = client()
    const outcome = await runToEnd(pay(c))
    expect(outcome).toMatchObject({ ok: true, value: { status: 201, source: 'replay', attempts: 13 } })
    expect(retries).toHaveLength(12)
    expect(retries.every((r) => r.retryAfter && r.delayMs === 1000)).toBe(true)
  })

  it('server-paced waits are bounded by retry.maxElapsedMs instead', async () => {
    serve(() => new HttpResponse(null, { status: 503, headers: { 'retry-after': '10' } }))
    const { client: c, store } = client({ retry: { maxElapsedMs: 45_000 } })
    const error = errorOf(await runToEnd(pay(c)))
    expect(isRetryExhaustedError(error)).toBe(true)
    expect((error as Error).message).toContain('retry.maxElapsedMs of 45000 ms')
    expect(seen).toHaveLength(5) // waits of 10 s: 4 fit in 45 s, the 5th would not
    expect(await store.list()).toHaveLength(1) // still pending
  })

  it('a Retry-After under one second, and a retry without one, still count against retry.limit', async () => {
    serve((n) =>
      n % 2
        ? new HttpResponse(null, { status: 429, headers: { 'retry-after': '0' } })
        : new HttpResponse(null, { status: 503 }),
    )
    const { client: c } = client({ retry: { limit: 3 } })
    const error = errorOf(await runToEnd(pay(c)))
    expect((error as Error).message).toContain('retry.limit of 3 reached')
    expect(seen).toHaveLength(4)
  })

  it('the backoff of the client’s own retries is not advanced by server-paced waits', async () => {
    serve((n) =>
      n === 1 || n === 2
        ? new HttpResponse(null, { status: 409, headers: { 'retry-after': '2' } })
        : n === 3
          ? new HttpResponse(null, { status: 502 })
          : HttpResponse.json({}),
    )
    const { client: c, retries } = client({ retry: { minDelayMs: 100 } })
    await runToEnd(pay(c))
    // The 502 is the first retry the client paces itself: 0.5 * min(maxDelayMs, 100 * 2^0).
    expect(retries.map((r) => [r.delayMs, r.retryAfter])).toEqual([
      [2000, true],
      [2000, true],
      [50, false],
    ])
  })

  it.each([408, 409, 429, 503, 500])(
    'never retries a replayed %i: the stored outcome of the key is final',
    async (status) => {
      serve(() =>
        HttpResponse.json(
          { title: 'stored', status },
          { status, headers: { 'idempotent-replayed': 'true', 'retry-after': '1' } },
        ),
      )
      const { client: c, store } = client()
      const error = errorOf(await runToEnd(pay(c, { intentId: `order:${status}` })))
      expect(error).toBeInstanceOf(HTTPError)
      expect(error).toMatchObject({ status })
      expect(seen).toHaveLength(1)
      expect(await c.pending()).toEqual([])
      const [record] = await store.list()
      expect(record).toMatchObject({ state: 'failed', outcome: { status, replayed: true } })
    },
  )

  it('never retries response_too_large: the handler would run again', async () => {
    serve(() =>
      HttpResponse.json(
        {
          type: 'urn:oncely:problem:response_too_large',
          title: 'Response is too large to be stored for replay',
          status: 500,
          code: 'response_too_large',
        },
        { status: 500, headers: { 'content-type': 'application/problem+json' } },
      ),
    )
    const { client: c } = client()
    const error = errorOf(await runToEnd(pay(c)))
    expect(error).toBeInstanceOf(HTTPError)
    expect(error).toMatchObject({ status: 500, problem: { code: 'response_too_large' } })
    expect(seen).toHaveLength(1)
    expect(await c.pending()).toEqual([])
  })

  it('retries lease_expired like any 503, waiting its Retry-After', async () => {
    serve((n) =>
      n === 1
        ? HttpResponse.json(
            {
              type: 'urn:oncely:problem:lease_expired',
              title: 'The attempt lost its lease before it finished',
              status: 503,
              code: 'lease_expired',
            },
            { status: 503, headers: { 'retry-after': '2', 'content-type': 'application/problem+json' } },
          )
        : HttpResponse.json({ id: 'pay_1' }, { status: 201 }),
    )
    const { client: c, retries } = client()
    const outcome = await runToEnd(pay(c))
    expect(outcome).toMatchObject({ ok: true, value: { status: 201, attempts: 2 } })
    expect(retries).toMatchObject([{ delayMs: 2000, retryAfter: true, reason: 'status 503' }])
  })

  it('an abort cancels the wait, rejects with the reason, and leaves the intent pending for resume()', async () => {
    serve((n) =>
      n === 1
        ? new HttpResponse(null, { status: 503, headers: { 'retry-after': '30' } })
        : HttpResponse.json({ id: 'pay_1' }),
    )
    const { client: c } = client()
    const controller = new AbortController()
    const running = pay(c, { signal: controller.signal })
    await vi.advanceTimersByTimeAsync(1000)
    controller.abort(new Error('user left'))
    const error = errorOf(await runToEnd(running))
    expect(error).toMatchObject({ message: 'user left' })
    expect(seen).toHaveLength(1)
    const [pending] = await c.pending()
    expect(pending).toMatchObject({ state: 'pending', attempts: 1 })
    const [outcome] = await c.resume()
    expect(outcome).toMatchObject({
      outcome: 'settled',
      key: seen[0]!.key,
      response: { data: { id: 'pay_1' }, attempts: 2 },
    })
    expect(seen[1]!.key).toBe(seen[0]!.key)
    expect(await c.pending()).toEqual([])
  })
})
