// The HTTP contract of the layer, the same cases for every adapter over a real socket: Fastify, Express (4 and 5),
// Koa (with @koa/router), the Fetch adapter under Hono on @hono/node-server, and NestJS on its Express and its
// Fastify platform. Effects are counted for the key (cart) under test.
import type { TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { migrate, postgresStore } from '../../src/index.js'
import { freshKey, reservation, setupDatabase, sleep } from '../helpers.js'
import {
  type AdapterName,
  adapters,
  HANDLER_HEADERS,
  HOOK_HEADER,
  RAW_PATH_ROUTERS,
  type RunningApp,
} from './servers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('adapters', { max: 40 })
})
afterAll(async () => {
  await db?.drop()
})

interface Result {
  status: number
  headers: Headers
  body: Buffer
  // biome-ignore lint/suspicious/noExplicitAny: tests read the JSON they sent back
  json(): any
}

async function send(
  app: RunningApp,
  path: string,
  key: string | undefined,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<Result> {
  // A string or raw bytes go out as they are; anything else as JSON.
  const payload = typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body)
  const response = await fetch(`${app.url}${path}`, {
    method: 'POST',
    headers: {
      authorization: 'Bearer tenant_1',
      'content-type': 'application/json',
      ...(key === undefined ? {} : { 'idempotency-key': key }),
      ...headers,
    },
    body: payload as BodyInit,
  })
  const bytes = Buffer.from(await response.arrayBuffer())
  return {
    status: response.status,
    headers: response.headers,
    body: bytes,
    json: () => JSON.parse(bytes.toString()),
  }
}

/**
 * An answer that is not the handler's own response carries none of the headers the handler set (its transaction
 * never committed, or its response is not the one sent), and every header set before the handler ran.
 */
function expectReplaced(res: Result): void {
  for (const name of Object.keys(HANDLER_HEADERS)) expect(res.headers.get(name), name).toBeNull()
  expect(res.headers.get(HOOK_HEADER[0])).toBe(HOOK_HEADER[1])
}

const effects = async (cart: string) =>
  (await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [cart])).rows[0].n as number
/** Key rows for `key` of the suite's tenant (`Bearer tenant_1`), whatever their status. */
const keyRows = async (key: string) =>
  (
    await db.pool.query(
      'SELECT count(*)::int AS n FROM oncely.idempotency_keys WHERE scope = $1 AND key = $2',
      ['tenant_1', key],
    )
  ).rows[0].n as number
const record = async (key: string) =>
  (await db.pool.query('SELECT status FROM oncely.idempotency_keys WHERE key = $1', [key])).rows[0]?.status as
    | string
    | undefined

describe.each(Object.keys(adapters) as AdapterName[])('%s', (name) => {
  const start = adapters[name]
  let app: RunningApp
  // The handler of /v1/slow waits here while a test holds it; `entered` resolves once a request got there (its key
  // is then in flight, whatever the reservation protocol left in the table).
  let hold: Promise<void> | undefined
  let release = () => {}
  let entered: Promise<void> = Promise.resolve()
  let enter = () => {}
  const holdSlow = () => {
    entered = new Promise<void>((resolve) => {
      enter = resolve
    })
    hold = new Promise<void>((resolve) => {
      release = () => {
        hold = undefined
        resolve()
      }
    })
  }
  beforeAll(async () => {
    app = await start(db.pool, {
      engine: { maxResponseBytes: 4_096 },
      gate: () => {
        enter()
        return hold ?? Promise.resolve()
      },
    })
  })
  afterAll(async () => {
    release()
    await app?.close()
  })
  const post = (key: string | undefined, body: unknown, headers?: Record<string, string>) =>
    send(app, '/v1/payments', key, body, headers)
  /**
   * Nest parses a JSON body before any interceptor runs (the layer re-parses the bytes it keeps, `rawBody: true`,
   * strictly). A body its parser cannot parse at all is refused there, with Nest's own 400 (`{ statusCode, message }`
   * as its exception filters render it), so nothing is reserved either; Fastify's parser also refuses an empty one.
   */
  const refusedByNestParser = (body: string) =>
    name.startsWith('nestjs') && (body !== '' || name === 'nestjs (fastify)') && !isJson(body)

  describe('first execution and replay', () => {
    it('replays the same status, bytes and safe headers with Idempotent-Replayed, without running again', async () => {
      const key = freshKey()
      const first = await post(key, { cart: key, amount: 100 })
      const second = await post(key, { amount: 100, cart: key, clientTime: 'later' })
      expect(first.status).toBe(201)
      expect(first.headers.get('idempotent-replayed')).toBeNull()
      expect(first.headers.get('set-cookie')).toBe('session=abc')
      expect(second.status).toBe(201)
      expect(second.body.equals(first.body)).toBe(true)
      for (const header of ['location', 'etag', 'content-type']) {
        expect(second.headers.get(header)).toBe(first.headers.get(header))
      }
      expect(second.headers.get('location')).toMatch(/^\/v1\/payments\/\d+$/)
      expect(second.headers.get('idempotent-replayed')).toBe('true')
      expect(second.headers.get('set-cookie')).toBeNull()
      expect(await effects(key)).toBe(1)
    })

    it('treats the RFC 8941 quoted form as the same key', async () => {
      const key = freshKey()
      const first = await post(key, { cart: key, amount: 1 })
      const quoted = await post(`"${key}"`, { cart: key, amount: 1 })
      expect(quoted.headers.get('idempotent-replayed')).toBe('true')
      expect(quoted.body.equals(first.body)).toBe(true)
    })

    it('runs an optional route without a key outside the layer, and with one inside it', async () => {
      const key = freshKey()
      const without = await send(app, '/v1/notes', undefined, {})
      expect(without.status).toBe(200)
      expect(without.json()).toEqual({ ok: true, keyed: false })
      const [a, b] = [await send(app, '/v1/notes', key, {}), await send(app, '/v1/notes', key, {})]
      expect(a.json()).toEqual({ ok: true, keyed: true })
      expect(b.body.equals(a.body)).toBe(true)
      expect(b.headers.get('idempotent-replayed')).toBe('true')
    })
  })

  describe('failures', () => {
    it('stores and replays a permanent failure (402)', async () => {
      const key = freshKey()
      const first = await post(key, { cart: key, amount: 1, decline: true })
      const second = await post(key, { cart: key, amount: 1, decline: true })
      expect(first.status).toBe(402)
      expect(first.json()).toMatchObject({ code: 'card_declined', message: 'Your card was declined.' })
      expect(second.status).toBe(402)
      expect(second.body.equals(first.body)).toBe(true)
      expect(second.headers.get('idempotent-replayed')).toBe('true')
      expect(await record(key)).toBe('failed_permanent')
    })

    it('releases the key after a retryable failure (a thrown 5xx): the retry runs the handler again', async () => {
      const key = freshKey()
      const first = await post(key, { cart: key, amount: 1, fail: 'throw' })
      expect(first.status).toBe(504)
      // The row protocol keeps a released row; the lock protocol's attempt left none.
      expect(await record(key)).toBe(reservation === 'row' ? 'failed_retryable' : undefined)
      const retry = await post(key, { cart: key, amount: 1, fail: 'throw' })
      expect(retry.status).toBe(504)
      expect(retry.headers.get('idempotent-replayed')).toBeNull()
      expect(await effects(key)).toBe(0)
    })

    it('answers 500 response_too_large and keeps no effect when the response exceeds the cap', async () => {
      const key = freshKey()
      const res = await post(key, { cart: key, amount: 1, big: 5_000 })
      expect(res.status).toBe(500)
      expect(res.headers.get('content-type')).toBe('application/problem+json')
      expect(res.json()).toMatchObject({ code: 'response_too_large' })
      expect(await effects(key)).toBe(0)
    })
  })

  describe("an answer that replaces the handler's response carries none of its headers", () => {
    it('the handler ran, then its response was too large: 500 response_too_large', async () => {
      const key = freshKey()
      const res = await post(key, { cart: key, amount: 1, big: 5_000 })
      expect(res.status).toBe(500)
      expect(res.json()).toMatchObject({ code: 'response_too_large' })
      expectReplaced(res)
    })

    it('the handler answered, then the store went away before the commit: 503 store_unavailable', async () => {
      const key = freshKey()
      const res = await post(key, { cart: key, amount: 1, fail: 'terminate' })
      expect(res.status).toBe(503)
      expect(res.json()).toMatchObject({ code: 'store_unavailable' })
      expect(res.headers.get('retry-after')).toBe('1')
      expectReplaced(res)
      // The server goes on serving (and the outage it logged is over).
      const next = freshKey()
      expect((await post(next, { cart: next, amount: 1 })).status).toBe(201)
    })

    it('the handler threw a permanent error after setting headers: the stored 402, first and replayed', async () => {
      const key = freshKey()
      const first = await post(key, { cart: key, amount: 1, decline: true })
      const replay = await post(key, { cart: key, amount: 1, decline: true })
      expect([first.status, replay.status]).toEqual([402, 402])
      expectReplaced(first)
      expectReplaced(replay)
    })

    it('the handler threw a retryable error after setting headers: the error page (504)', async () => {
      const key = freshKey()
      const res = await post(key, { cart: key, amount: 1, fail: 'throw' })
      expect(res.status).toBe(504)
      expectReplaced(res)
    })

    it('a replay, a 409 and a 422 keep what was set before the handler', async () => {
      const key = freshKey()
      const first = await post(key, { cart: key, amount: 1 })
      expect(first.headers.get('set-cookie')).toBe(HANDLER_HEADERS['set-cookie'])
      expect(first.headers.get('x-handler')).toBe(HANDLER_HEADERS['x-handler'])
      expect(first.headers.get(HOOK_HEADER[0])).toBe(HOOK_HEADER[1])
      const replay = await post(key, { cart: key, amount: 1 })
      expect(replay.headers.get('idempotent-replayed')).toBe('true')
      expectReplaced(replay)
      const mismatch = await post(key, { cart: key, amount: 2 })
      expect(mismatch.status).toBe(422)
      expectReplaced(mismatch)
    })
  })

  describe('refused before anything is reserved, as problem+json', () => {
    it.each([
      ['missing', undefined, 'idempotency_key_missing'],
      ['malformed', 'caf\u00e9', 'idempotency_key_malformed'],
      ['too long', 'k'.repeat(256), 'idempotency_key_too_long'],
      ['repeated', 'a, b', 'idempotency_key_repeated'],
    ])('a %s key: 400 with its own code', async (_, key, code) => {
      const res = await post(key, { cart: 'c', amount: 1 }, { accept: 'text/html' })
      expect(res.status).toBe(400)
      expect(res.headers.get('content-type')).toBe('application/problem+json')
      expect(res.json()).toMatchObject({ status: 400, code, type: `urn:oncely:problem:${code}` })
    })

    it.each([
      ['duplicate member names', '{"cart":"a","cart":"b","amount":1}'],
      ['an integer beyond 2^53', '{"cart":"a","amount":9007199254740993}'],
      ['broken JSON', '{"cart":'],
      ['an empty JSON body', ''],
    ])('%s: 400 invalid_json', async (_, body) => {
      const key = freshKey()
      const res = await post(key, body)
      expect(res.status).toBe(400)
      if (refusedByNestParser(body)) {
        expect(res.json()).toMatchObject({ statusCode: 400 })
      } else {
        expect(res.headers.get('content-type')).toBe('application/problem+json')
        expect(res.json()).toMatchObject({ code: 'invalid_json' })
      }
      expect(await record(key)).toBeUndefined()
    })

    // Canonical JSON (RFC 8785) is defined on I-JSON, which has no lone surrogates: such a body has no fingerprint
    // and no canonical form to store, so it is refused with the other bad JSON, and the key stays free for the
    // client's corrected request.
    it.each([
      ['a lone high surrogate', (key: string) => `{"cart":"${key}","amount":1,"memo":"\\ud800"}`],
      ['a lone low surrogate', (key: string) => `{"cart":"${key}","amount":1,"memo":"x\\udc00y"}`],
      [
        'a high surrogate before a non-surrogate',
        (key: string) => `{"cart":"${key}","amount":1,"memo":"\\ud800\\u0041"}`,
      ],
      [
        'surrogates in the wrong order',
        (key: string) => `{"cart":"${key}","amount":1,"memo":"\\udc00\\ud800"}`,
      ],
      ['a lone surrogate in a member name', (key: string) => `{"cart":"${key}","amount":1,"\\udfff":0}`],
    ])(
      '%s escaped in a string: 400 invalid_json, no key row, and the key then runs a correct body once',
      async (_, bodyFor) => {
        const key = freshKey()
        const res = await post(key, bodyFor(key))
        expect(res.status).toBe(400)
        expect(res.headers.get('content-type')).toBe('application/problem+json')
        expect(res.json()).toMatchObject({ status: 400, code: 'invalid_json' })
        expect(res.json().detail).toMatch(/surrogate/)
        expect(await keyRows(key)).toBe(0)
        expect(await effects(key)).toBe(0)
        const corrected = await post(key, { cart: key, amount: 1 })
        expect(corrected.status).toBe(201)
        expect(corrected.headers.get('idempotent-replayed')).toBeNull()
        expect(await effects(key)).toBe(1)
        expect(await keyRows(key)).toBe(1)
      },
    )

    // I-JSON (RFC 7493), the input of canonical JSON, is UTF-8. A lenient decoder turns every invalid sequence into
    // U+FFFD, so bodies that differ only in their invalid bytes would share a fingerprint: the second would be
    // answered as a replay of the first instead of 422.
    const withBytes = (key: string, ...bytes: number[]) =>
      Buffer.concat([
        Buffer.from(`{"cart":"${key}","amount":1,"memo":"a`),
        Buffer.from(bytes),
        Buffer.from('b"}'),
      ])
    it.each([
      ['a byte that is never UTF-8 (0xff)', [0xff]],
      ['a lone continuation byte', [0x80]],
      ['a truncated sequence', [0xe2, 0x82]],
      ['an overlong encoding', [0xc0, 0xaf]],
      ['an encoded surrogate (CESU-8)', [0xed, 0xa0, 0x80]],
      ['a code point beyond U+10FFFF', [0xf4, 0x90, 0x80, 0x80]],
    ])(
      '%s in a string: 400 invalid_json, no key row, and the key then runs a correct body once',
      async (_, bytes) => {
        const key = freshKey()
        const res = await post(key, withBytes(key, ...bytes))
        expect(res.status).toBe(400)
        expect(res.headers.get('content-type')).toBe('application/problem+json')
        expect(res.json()).toMatchObject({ status: 400, code: 'invalid_json' })
        expect(res.json().detail).toMatch(/UTF-8/)
        expect(await keyRows(key)).toBe(0)
        expect(await effects(key)).toBe(0)
        const corrected = await post(key, { cart: key, amount: 1 })
        expect(corrected.status).toBe(201)
        expect(corrected.headers.get('idempotent-replayed')).toBeNull()
        expect(await effects(key)).toBe(1)
        expect(await keyRows(key)).toBe(1)
      },
    )

    it('two bodies that differ only in their invalid bytes are both refused, never taken for each other', async () => {
      const key = freshKey()
      const first = await post(key, withBytes(key, 0xff))
      const second = await post(key, withBytes(key, 0xfe))
      for (const res of [first, second]) {
        expect(res.status).toBe(400)
        expect(res.json()).toMatchObject({ code: 'invalid_json' })
        expect(res.headers.get('idempotent-replayed')).toBeNull()
      }
      expect(await keyRows(key)).toBe(0)
      expect(await effects(key)).toBe(0)
      // Nor for a body holding U+FFFD itself, which is an ordinary character (the one a lenient decoder writes).
      const replacement = await post(key, withBytes(key, 0xef, 0xbf, 0xbd))
      const invalid = await post(key, withBytes(key, 0xff))
      expect(replacement.status).toBe(201)
      expect(invalid.status).toBe(400)
      expect(invalid.headers.get('idempotent-replayed')).toBeNull()
      expect(await effects(key)).toBe(1)
    })

    it('a UTF-8 byte order mark before the JSON text is ignored (RFC 8259 allows it); one later is text', async () => {
      const key = freshKey()
      const bom = Buffer.from([0xef, 0xbb, 0xbf])
      const plain = await post(key, Buffer.from(`{"cart":"${key}","amount":1}`))
      const marked = await post(key, Buffer.concat([bom, Buffer.from(`{"cart":"${key}","amount":1}`)]))
      expect(plain.status).toBe(201)
      expect(marked.status).toBe(201)
      expect(marked.headers.get('idempotent-replayed')).toBe('true')
      // Inside a string it is the character U+FEFF, so another payload; anywhere else between tokens it is no JSON.
      const inString = await post(key, withBytes(key, ...bom))
      expect(inString.status).toBe(422)
      const twice = await post(freshKey(), Buffer.concat([bom, bom, Buffer.from('{"amount":1}')]))
      expect(twice.status).toBe(400)
      expect(twice.json()).toMatchObject(
        refusedByNestParser('\ufeff{') ? { statusCode: 400 } : { code: 'invalid_json' },
      )
      expect(await effects(key)).toBe(1)
    })

    it('a well-formed surrogate pair, escaped or not, is an ordinary character', async () => {
      const key = freshKey()
      const escaped = await post(key, `{"cart":"${key}","amount":1,"memo":"\\ud83d\\ude00"}`)
      const raw = await post(key, { cart: key, amount: 1, memo: '\u{1F600}' })
      expect(escaped.status).toBe(201)
      expect(raw.status).toBe(201)
      expect(raw.headers.get('idempotent-replayed')).toBe('true')
      expect(await effects(key)).toBe(1)
    })

    it('a body over the route limit: 413', async () => {
      const key = freshKey()
      const res = await post(key, { cart: 'x'.repeat(2_000), amount: 1 })
      expect(res.status).toBe(413)
      expect(res.json()).toMatchObject({ code: 'payload_too_large' })
      expect(await record(key)).toBeUndefined()
    })

    it.each(['text/plain', 'application/x-www-form-urlencoded'])('a %s body: 415', async (type) => {
      const key = freshKey()
      const res = await post(key, 'cart=a&amount=1', { 'content-type': type })
      expect(res.status).toBe(415)
      expect(res.json()).toMatchObject({ code: 'unsupported_media_type' })
      expect(await record(key)).toBeUndefined()
    })

    it('a request the auth rejects', async () => {
      const key = freshKey()
      const res = await post(key, { cart: key, amount: 1 }, { authorization: 'nobody' })
      expect(res.status).toBe(401)
      expect(await record(key)).toBeUndefined()
    })

    it('a tenant function that returns nothing: 500 problem+json, and the cause in the log', async () => {
      const key = freshKey()
      const res = await post(key, { cart: key, amount: 1 }, { authorization: 'Bearer none' })
      expect(res.status).toBe(500)
      expect(res.headers.get('content-type')).toBe('application/problem+json')
      expect(await record(key)).toBeUndefined()
      expect(app.errors.some((line) => /`tenant` function .* returned undefined/.test(line.msg))).toBe(true)
    })
  })

  describe('the same key twice', () => {
    it('422 for another payload, without echoing the stored response', async () => {
      const key = freshKey()
      await post(key, { cart: key, amount: 1 })
      const res = await post(key, { cart: key, amount: 2 })
      expect(res.status).toBe(422)
      expect(res.json()).toMatchObject({ code: 'idempotency_key_reused' })
      expect(res.body.toString()).not.toContain(key)
    })

    it('while the first is in flight: 409 + Retry-After for the same payload; another is never run (422)', async () => {
      const key = freshKey()
      holdSlow()
      const first = send(app, '/v1/slow', key, { cart: key, amount: 1 })
      await entered
      const other = await send(app, '/v1/slow', key, { cart: key, amount: 2 })
      // The row protocol's committed row names the first payload, so it can answer 422 at once; the lock protocol
      // has nothing committed yet and answers 409, which a client retries into the 422 below.
      expect(other.status).toBe(reservation === 'row' ? 422 : 409)
      const same = await send(app, '/v1/slow', key, { cart: key, amount: 1 })
      expect(same.status).toBe(409)
      expect(same.headers.get('content-type')).toBe('application/problem+json')
      expect(same.json()).toMatchObject({ code: 'request_in_progress' })
      expect(Number(same.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
      release()
      expect((await first).status).toBe(201)
      expect((await send(app, '/v1/slow', key, { cart: key, amount: 2 })).status).toBe(422)
      expect(await effects(key)).toBe(1)
    })

    it('a duplicate waits (bounded) for the one in flight and answers with its result', async () => {
      const key = freshKey()
      holdSlow()
      const first = send(app, '/v1/waiting', key, { cart: key, amount: 1 })
      await entered
      const duplicate = send(app, '/v1/waiting', key, { cart: key, amount: 1 })
      await sleep(50)
      release()
      const [a, b] = await Promise.all([first, duplicate])
      expect(a.status).toBe(201)
      expect(b.status).toBe(201)
      expect(b.headers.get('idempotent-replayed')).toBe('true')
      expect(b.body.equals(a.body)).toBe(true)
      expect(await effects(key)).toBe(1)
    })

    it('concurrent duplicates: one effect; every answer is 409 or the identical response', async () => {
      const key = freshKey()
      const body = { cart: key, amount: 42 }
      const results = await Promise.all(Array.from({ length: 20 }, () => post(key, body)))
      expect(await effects(key)).toBe(1)
      const created = results.filter((r) => r.status === 201)
      const conflicts = results.filter((r) => r.status === 409)
      expect(created.length + conflicts.length).toBe(20)
      expect(created.filter((r) => r.headers.get('idempotent-replayed') === null)).toHaveLength(1)
      for (const replay of created) expect(replay.body.equals(created[0]!.body)).toBe(true)
      for (const conflict of conflicts) {
        expect(conflict.headers.get('content-type')).toBe('application/problem+json')
        expect(Number(conflict.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
      }
    })

    it('scopes keys by tenant: another tenant with the same key executes its own request', async () => {
      const key = freshKey()
      const a = await post(key, { cart: key, amount: 1 })
      const b = await post(key, { cart: key, amount: 1 }, { authorization: 'Bearer tenant_2' })
      expect(a.status).toBe(201)
      expect(b.status).toBe(201)
      expect(b.headers.get('idempotent-replayed')).toBeNull()
      expect(b.json().id).not.toBe(a.json().id)
      expect(await effects(key)).toBe(2)
    })
  })

  // The request's identity is what the handler acts on: the route and the values of its path parameters, as the
  // router decoded them. Effects are booked per cart and account (`<key>/<account>`).
  describe('the resource the path names', () => {
    const transfer = (account: string, key: string, body: unknown) =>
      send(app, `/v1/accounts/${account}/transfers`, key, body)

    it('the same key on another resource of one route: 422 idempotency_key_reused, and that transfer never runs', async () => {
      const key = freshKey()
      const body = { cart: key, amount: 7 }
      const a = await transfer('A', key, body)
      expect(a.status).toBe(201)
      expect(a.json()).toEqual({ account: 'A', cart: key })
      const b = await transfer('B', key, body)
      expect(b.status).toBe(422)
      expect(b.headers.get('content-type')).toBe('application/problem+json')
      expect(b.json()).toMatchObject({ code: 'idempotency_key_reused' })
      expect(b.headers.get('idempotent-replayed')).toBeNull()
      const again = await transfer('A', key, body)
      expect(again.headers.get('idempotent-replayed')).toBe('true')
      expect(again.body.equals(a.body)).toBe(true)
      expect(await effects(`${key}/A`)).toBe(1)
      expect(await effects(`${key}/B`)).toBe(0)
    })

    it('one resource with a percent-encoded parameter is the same request: replayed, run once', async () => {
      const key = freshKey()
      const body = { cart: key, amount: 7 }
      const plain = await transfer('A', key, body)
      const encoded = await transfer('%41', key, body)
      expect(plain.status).toBe(201)
      expect(encoded.status).toBe(201)
      expect(encoded.headers.get('idempotent-replayed')).toBe('true')
      expect(encoded.body.equals(plain.body)).toBe(true)
      expect(await effects(`${key}/A`)).toBe(1)
    })

    it('a percent-encoded spelling of a path the router matches to the same route: one operation, run once', async () => {
      const key = freshKey()
      const body = { cart: key, amount: 7 }
      const plain = await send(app, '/v1/orders', key, body)
      expect(plain.status).toBe(201)
      const encoded = await send(app, '/v1/%6Frders', key, body)
      if (RAW_PATH_ROUTERS.has(name)) {
        // These routers match routes on the path as sent: the encoded spelling is no route of this app.
        expect(encoded.status).toBe(404)
      } else {
        expect(encoded.status).toBe(201)
        expect(encoded.headers.get('idempotent-replayed')).toBe('true')
        expect(encoded.body.equals(plain.body)).toBe(true)
      }
      expect(await effects(`${key}/orders`)).toBe(1)
      expect(await keyRows(key)).toBe(1)
    })
  })

  describe('crashes and a store that fails', () => {
    /** An app whose engine throws once at `step`, as a process that crashed there would stop. */
    async function crashingOnce(step: 'beforeCommit' | 'afterCommit', leaseMs?: number) {
      let crash = true
      return start(db.pool, {
        engine: {
          ...(leaseMs ? { leaseMs } : {}),
          hooks: {
            [step]: () => {
              if (crash) {
                crash = false
                throw new Error(`injected crash at ${step}`)
              }
            },
          },
        },
      })
    }

    it('an attempt that crashed mid-handler gives its key to the next (after its lease under row, at once under lock), with one effect', async () => {
      // Long enough that a loaded machine cannot outlast it between the crash and the check that the key is held (an
      // answer, a count and a request: a second was once too short).
      const lease = 2_000
      const crashing = await crashingOnce('beforeCommit', lease)
      try {
        const key = freshKey()
        const body = { cart: key, amount: 5 }
        const first = await send(crashing, '/v1/payments', key, body)
        expect(first.status).toBeGreaterThanOrEqual(500)
        expect(first.headers.get('location')).toBeNull()
        expectReplaced(first)
        expect(await effects(key)).toBe(0)
        if (reservation === 'row') {
          const during = await send(crashing, '/v1/payments', key, body)
          expect(during.status).toBe(409)
          await sleep(lease + 50)
        }
        const retry = await send(crashing, '/v1/payments', key, body)
        expect(retry.status).toBe(201)
        const again = await send(crashing, '/v1/payments', key, body)
        expect(again.body.equals(retry.body)).toBe(true)
        expect(again.headers.get('idempotent-replayed')).toBe('true')
        expect(await effects(key)).toBe(1)
      } finally {
        await crashing.close()
      }
    })

    it('a crash after the commit, before the reply: the client saw nothing, and the retry replays', async () => {
      const crashing = await crashingOnce('afterCommit')
      try {
        const key = freshKey()
        const body = { cart: key, amount: 6 }
        const first = await send(crashing, '/v1/payments', key, body)
        expect(first.status).toBeGreaterThanOrEqual(500)
        expect(first.headers.get('location')).toBeNull()
        expectReplaced(first)
        const retry = await send(crashing, '/v1/payments', key, body)
        expect(retry.status).toBe(201)
        expect(retry.headers.get('idempotent-replayed')).toBe('true')
        expect(await effects(key)).toBe(1)
      } finally {
        await crashing.close()
      }
    })

    it('a store without its table: 503 store_unavailable + Retry-After, nothing runs, one error log naming the fix', async () => {
      const schema = `lost_${name.replace(/\W/g, '_').toLowerCase()}`
      await migrate(db.pool, { schema })
      const broken = await start(db.pool, { engine: { store: postgresStore({ pool: db.pool, schema }) } })
      try {
        await db.pool.query(`DROP SCHEMA ${schema} CASCADE`)
        const keys = [freshKey(), freshKey(), freshKey()]
        for (const key of keys) {
          const res = await send(broken, '/v1/payments', key, { cart: key, amount: 1 })
          expect(res.status).toBe(503)
          expect(res.headers.get('retry-after')).toBe('1')
          expect(res.json()).toMatchObject({ code: 'store_unavailable' })
          expect(await effects(key)).toBe(0)
        }
        await waitUntil(async () => broken.errors.some((line) => line.msg.includes('migrate(pool')))
        const outage = broken.errors.filter((line) => line.msg.includes('idempotency store failed'))
        expect(outage).toHaveLength(1)
        expect(outage[0]!.msg).toContain(`"${schema}"`)
      } finally {
        await broken.close()
      }
    })
  })
})

function isJson(text: string): boolean {
  try {
    JSON.parse(text)
    return true
  } catch {
    return false
  }
}

async function waitUntil(condition: () => Promise<boolean>, timeoutMs = 5_000): Promise<void> {
  const until = Date.now() + timeoutMs
  while (!(await condition())) {
    if (Date.now() > until) throw new Error('condition not met in time')
    await sleep(10)
  }
}
