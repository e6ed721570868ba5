// @oncely/client/ky: the retry rules of the client, through a ky instance. Every count is of the requests that
// carried the key under test, so a second loop stacked on oncely's (ky's own retry) shows up as extra requests.
import ky, { isHTTPError as isKyHTTPError } from 'ky'
import { HttpResponse, http } from 'msw'
import { setupServer } from 'msw/node'
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest'
import {
  createClient,
  type IntentStore,
  isIdempotencyKeyReusedError,
  isRetryExhaustedError,
  memoryStore,
  type OncelyClient,
} from '../src/index.js'
import { intentOf, withOncely } from '../src/ky/index.js'
import { errorOf, runToEnd } from './helpers.js'

const BASE = 'http://api.test'
const server = setupServer()
interface Seen {
  method: string
  key: string | null
  body: string
  /** What the store held for this key when the request arrived. */
  stored: unknown
}
const seen: Seen[] = []
let store: IntentStore
let client: OncelyClient

type Reply = (attempt: number, request: Request) => Response | Promise<Response>
function serve(reply: Reply, method: 'post' | 'put' | 'get' = 'post') {
  server.use(
    http[method](`${BASE}/v1/payments`, async ({ request }) => {
      const key = request.headers.get('idempotency-key')
      seen.push({
        method: request.method,
        key,
        body: await request.clone().text(),
        stored: (await store.list()).find((record) => record.key === key),
      })
      return reply(seen.filter((s) => s.key === key).length, request)
    }),
  )
}
const forKey = (key: string | undefined) => seen.filter((s) => s.key === key)

function wrapped(instance = ky.create({ prefixUrl: BASE })) {
  return withOncely(instance, { client })
}

beforeAll(() => server.listen({ onUnhandledRequest: 'error' }))
beforeEach(() => {
  seen.length = 0
  vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'Date'] })
  store = memoryStore()
  client = createClient({
    baseUrl: 'http://unused.test',
    store,
    random: () => 0.5,
    resumeOnOnline: false,
    retry: { limit: 2 },
  })
})
afterEach(async () => {
  server.resetHandlers()
  vi.useRealTimers()
  await client.close()
})
afterAll(() => server.close())

describe('intents through ky', () => {
  it('a POST carries one key, and its intent (the exact bytes) is in the store before its first byte', async () => {
    serve(() => HttpResponse.json({ id: 'pay_1' }, { status: 201 }))
    const response = await wrapped().post('v1/payments', { json: { amount: 100 }, searchParams: { a: '1' } })
    expect(response.status).toBe(201)
    expect(await response.json()).toEqual({ id: 'pay_1' })
    const intent = intentOf(response)
    expect(intent).toMatchObject({ source: 'network', replayed: false, attempts: 1 })
    expect(forKey(intent?.key)).toEqual([
      {
        method: 'POST',
        key: intent?.key,
        body: '{"amount":100}',
        stored: expect.objectContaining({
          key: intent?.key,
          method: 'POST',
          url: `${BASE}/v1/payments?a=1`,
          body: { encoding: 'utf8', data: '{"amount":100}' },
          headers: expect.objectContaining({ 'content-type': 'application/json' }),
          state: 'pending',
        }),
      },
    ])
    expect(await store.list()).toEqual([]) // settled: a one-off intent is deleted before ky resolves
  })

  it('binary bodies are stored and sent byte for byte', async () => {
    serve(async (_, request) => HttpResponse.json({ size: (await request.arrayBuffer()).byteLength }))
    const bytes = new Uint8Array([0xff, 0x00, 0xfe, 0x01])
    const data = await wrapped()
      .post('v1/payments', { body: bytes, headers: { 'content-type': 'application/octet-stream' } })
      .json()
    expect(data).toEqual({ size: 4 })
    expect(seen[0]!.stored).toMatchObject({ body: { encoding: 'base64', data: '/wD+AQ==' } })
  })

  it.each([409, 429, 503])(
    'retries %i after its Retry-After, with the same key and bytes',
    async (status) => {
      serve((n) =>
        n === 1
          ? HttpResponse.json({ status }, { status, headers: { 'retry-after': '3' } })
          : HttpResponse.json({ id: 'pay_1' }, { status: 201 }),
      )
      const keys: string[] = []
      const started = Date.now()
      const outcome = await runToEnd(
        wrapped()
          .post('v1/payments', { json: { amount: 5 }, oncely: { onIntent: ({ key }) => keys.push(key) } })
          .json(),
      )
      expect(outcome).toEqual({ ok: true, value: { id: 'pay_1' } })
      expect(forKey(keys[0]).map((s) => s.body)).toEqual(['{"amount":5}', '{"amount":5}'])
      expect(seen).toHaveLength(2)
      expect(Date.now() - started).toBeGreaterThanOrEqual(3000) // fake time: the wait the server asked for
    },
  )

  it('never retries a 422: rejects with IdempotencyKeyReusedError after one request', async () => {
    const problem = { type: 'urn:oncely:problem:idempotency_key_reused', title: 'reused', status: 422 }
    serve(() =>
      HttpResponse.json(problem, { status: 422, headers: { 'content-type': 'application/problem+json' } }),
    )
    const keys: string[] = []
    const error = errorOf(
      await runToEnd(
        wrapped().post('v1/payments', { json: {}, oncely: { onIntent: ({ key }) => keys.push(key) } }),
      ),
    )
    expect(isIdempotencyKeyReusedError(error)).toBe(true)
    expect(error).toMatchObject({ status: 422, problem })
    expect(forKey(keys[0])).toHaveLength(1)
    expect(seen).toHaveLength(1)
  })

  it('a final 4xx is ky HTTPError (its hooks run), and a Response with throwHttpErrors: false', async () => {
    serve(() => HttpResponse.json({ title: 'Card declined', status: 402 }, { status: 402 }))
    const beforeError = vi.fn((error) => error)
    const api = withOncely(ky.create({ prefixUrl: BASE, hooks: { beforeError: [beforeError] } }), { client })
    const error = errorOf(await runToEnd(api.post('v1/payments', { json: { card: 'card_1' } })))
    expect(isKyHTTPError(error)).toBe(true)
    if (!isKyHTTPError(error)) return
    expect(error.response.status).toBe(402)
    expect(await error.response.json()).toEqual({ title: 'Card declined', status: 402 })
    expect(intentOf(error.response)).toMatchObject({ key: seen[0]!.key, replayed: false, source: undefined })
    expect(beforeError).toHaveBeenCalledTimes(1)
    const response = await api.post('v1/payments', { json: { card: 'card_1' }, throwHttpErrors: false })
    expect(response.status).toBe(402)
    expect(seen).toHaveLength(2) // one request for each of the two one-off intents
  })
})

describe("ky's retry never stacks on oncely's", () => {
  it.each([
    ['a default ky instance (which retries PUT)', 'put' as const, ky.create({ prefixUrl: BASE })],
    [
      'an instance that retries POST five times',
      'post' as const,
      ky.create({ prefixUrl: BASE, retry: { limit: 5, methods: ['post', 'put'], statusCodes: [503] } }),
    ],
    ['an instance with retry: 4', 'put' as const, ky.create({ prefixUrl: BASE, retry: 4 })],
  ])('%s: 1 + retry.limit requests for the key, not more', async (_, method, instance) => {
    serve(() => HttpResponse.json({ title: 'down' }, { status: 503 }), method)
    const keys: string[] = []
    const api = withOncely(instance, { client })
    const call = api[method]('v1/payments', {
      json: { amount: 1 },
      oncely: { onIntent: ({ key }) => keys.push(key) },
    })
    const error = errorOf(await runToEnd(call))
    expect(isRetryExhaustedError(error)).toBe(true)
    expect(keys).toHaveLength(1)
    expect(forKey(keys[0])).toHaveLength(3) // the first attempt and createClient's retry.limit of 2
    expect(seen).toHaveLength(3)
    expect(await store.list()).toMatchObject([{ key: keys[0], state: 'pending' }]) // for client.resume()
  })

  it("ky's own retry still serves the requests that are not intents", async () => {
    serve((n) => (n < 3 ? new HttpResponse(null, { status: 503 }) : HttpResponse.json({ ok: true })), 'get')
    const outcome = await runToEnd(
      wrapped(ky.create({ prefixUrl: BASE, retry: { limit: 2 } }))
        .get('v1/payments')
        .json(),
    )
    expect(outcome).toEqual({ ok: true, value: { ok: true } })
    expect(seen.map((s) => s.key)).toEqual([null, null, null])
  })

  it("a request's own `retry` that would let ky retry an intent is refused before anything is written or sent", async () => {
    serve(() => HttpResponse.json({}), 'put')
    const error = errorOf(await runToEnd(wrapped().put('v1/payments', { json: {}, retry: 3 })))
    expect(error).toBeInstanceOf(TypeError)
    expect((error as Error).message).toMatch(
      /ky would retry this PUT intent.*pass `retry: 0` with the request/,
    )
    expect(seen).toEqual([])
    expect(await store.list()).toEqual([])
    // The fix the message names works.
    expect((await wrapped().put('v1/payments', { json: {}, retry: 0 })).status).toBe(200)
  })

  it("an afterResponse hook's ky.retry() of an intent is refused: the intent was sent once", async () => {
    serve(() => HttpResponse.json({ again: true }))
    const api = withOncely(
      ky.create({ prefixUrl: BASE, retry: { limit: 3 }, hooks: { afterResponse: [() => ky.retry()] } }),
      { client },
    )
    const error = errorOf(await runToEnd(api.post('v1/payments', { json: {} })))
    expect((error as Error).message).toMatch(/ky\.retry\(\)/)
    expect(seen).toHaveLength(1)
  })

  it("a request's own `fetch` is refused for an intent", async () => {
    const error = errorOf(
      await runToEnd(wrapped().post('v1/payments', { json: {}, fetch: globalThis.fetch })),
    )
    expect((error as Error).message).toMatch(/own `fetch` option/)
    expect(seen).toEqual([])
  })
})

describe('which requests are intents', () => {
  it('oncely: false sends a POST as plain ky; oncely: true makes a GET an intent', async () => {
    serve(() => HttpResponse.json({}))
    serve(() => HttpResponse.json({}), 'get')
    await wrapped().post('v1/payments', { json: {}, oncely: false })
    await wrapped().get('v1/payments', { oncely: true, retry: 0 }) // ky retries GETs: not an intent
    expect(errorOf(await runToEnd(wrapped().get('v1/payments', { oncely: true })))).toMatchObject({
      message: expect.stringMatching(/ky would retry this GET intent/),
    })
    expect(seen.map((s) => [s.method, s.key === null])).toEqual([
      ['POST', true],
      ['GET', false],
    ])
  })

  it('oncely.intentId derives the key: the same fact again is answered from the store, nothing sent', async () => {
    serve(() => HttpResponse.json({ id: 'pay_1' }, { status: 201 }))
    const api = wrapped()
    const pay = () => api.post('v1/payments', { json: { amount: 9 }, oncely: { intentId: 'order:7' } })
    const first = await pay()
    const again = await pay()
    expect(intentOf(first)).toMatchObject({ intentId: 'order:7', source: 'network' })
    expect(intentOf(again)).toMatchObject({ intentId: 'order:7', key: intentOf(first)?.key, source: 'store' })
    expect(await again.json()).toEqual({ id: 'pay_1' })
    expect(forKey(intentOf(first)?.key)).toHaveLength(1)
  })

  it('`methods` narrows the intents', async () => {
    serve(() => HttpResponse.json({}), 'put')
    await withOncely(ky.create({ prefixUrl: BASE, retry: 0 }), { client, methods: ['POST'] }).put(
      'v1/payments',
    )
    expect(seen.map((s) => s.key)).toEqual([null])
  })
})

describe('options are checked', () => {
  it('at construction, naming every bad option', () => {
    expect(() => withOncely(ky, { client: {} as OncelyClient, methods: 'POST' as never })).toThrow(
      /withOncely: 2 invalid options: Expected `client` to be an oncely client.*Expected `methods` to be an array/,
    )
    expect(() => withOncely({} as never, { client })).toThrow(/Expected `instance` to be a ky instance/)
  })

  it('per request, before anything is written or sent', async () => {
    const bad = { intentId: 7, colour: 'red' } as never
    const error = errorOf(await runToEnd(wrapped().post('v1/payments', { json: {}, oncely: bad })))
    expect((error as Error).message).toMatch(
      /Unknown option `oncely.colour`.*Expected `oncely.intentId` to be/,
    )
    expect(seen).toEqual([])
    expect(await store.list()).toEqual([])
  })
})

it("ky's timeout ends the call, leaves the intent pending, and client.resume() finishes it with the same key", async () => {
  serve((n) =>
    n === 1
      ? HttpResponse.json({}, { status: 503, headers: { 'retry-after': '20' } })
      : HttpResponse.json({ id: 'pay_1' }),
  )
  const keys: string[] = []
  const api = withOncely(ky.create({ prefixUrl: BASE, timeout: 5000 }), { client })
  const error = errorOf(
    await runToEnd(
      api.post('v1/payments', { json: { amount: 3 }, oncely: { onIntent: ({ key }) => keys.push(key) } }),
    ),
  )
  expect(error).toMatchObject({ name: 'TimeoutError' })
  expect(await client.pending()).toMatchObject([{ key: keys[0] }])
  const outcome = await runToEnd(client.resume())
  expect(outcome).toMatchObject({ ok: true, value: [{ outcome: 'settled', key: keys[0] }] })
  expect(forKey(keys[0]).map((s) => s.body)).toEqual(['{"amount":3}', '{"amount":3}'])
})
