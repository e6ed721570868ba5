// What only the Express adapter has: the ways a handler writes to `res`, body parsers mounted before it, `next`,
// option checks and the type of req.idempotency, under Express 5 and Express 4 (installed as `express4`), and what
// differs between the two (async errors, req.query, path syntax). The shared HTTP contract is in contract.test.ts.
import type { AddressInfo } from 'node:net'
import { Readable } from 'node:stream'
import type { TestDatabase } from '@oncely/test-support'
import express from 'express'
import express4 from 'express4'
import { afterAll, beforeAll, describe, expect, expectTypeOf, it } from 'vitest'
import type { ExecutionContext } from '../../src/engine/types.js'
import { idempotency } from '../../src/express/index.js'
import { engineFor, freshKey, setupDatabase } from '../helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('express')
})
afterAll(async () => {
  await db?.drop()
})
const effects = async (cart: string) =>
  (await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [cart])).rows[0].n as number

/** Listens on a free port; resolves with the URL and the server. */
async function listen(app: express.Express) {
  const server = app.listen(0, '127.0.0.1')
  await new Promise<void>((resolve) => server.once('listening', resolve))
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` }
}
const close = (server: ReturnType<express.Express['listen']> | undefined) =>
  new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()))

describe.each([
  ['Express 5', express],
  ['Express 4', express4],
] as const)('%s', (_version, framework) => {
  let url: string
  let server: ReturnType<express.Express['listen']>
  const errors: string[] = []
  let runs = 0
  let endCallbacks = 0

  beforeAll(async () => {
    const idempotent = idempotency({
      engine: engineFor(db.pool).engine,
      tenant: () => 'tenant_1',
      logger: { error: (_details, message) => errors.push(message) },
    })
    const app = framework()
    const insert = (req: express.Request & { idempotency: ExecutionContext }) => {
      runs++
      return req.idempotency.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 1)', [
        'tenant_1',
        (req.body as { cart: string }).cart,
      ])
    }
    app.post(
      '/write-head',
      idempotent(async (req, res) => {
        await insert(req)
        res.writeHead(202, 'Accepted', { 'content-type': 'text/plain', location: '/x/1' })
        res.write('part one, ')
        res.end('part two', () => {
          endCallbacks++
        })
      }),
    )
    app.post(
      '/piped',
      idempotent(async (req, res) => {
        await insert(req)
        res.status(201).type('application/json')
        Readable.from(['{"streamed":', 'true}']).pipe(res)
      }),
    )
    app.post(
      '/callback',
      idempotent((req, res) => {
        // Answers after the handler returned, from a callback.
        void insert(req).then(() => setTimeout(() => res.status(201).json({ late: true }), 10))
      }),
    )
    app.post(
      '/next-error',
      idempotent(async (req, _res, next) => {
        await insert(req)
        next(Object.assign(new Error('declined'), { statusCode: 402 }))
      }),
    )
    app.post(
      '/next-route',
      idempotent(async (req, _res, next) => {
        await insert(req)
        next('route')
      }),
    )
    app.post('/next-route', (_req, res) => {
      res.status(201).json({ from: 'the next route' })
    })
    app.use('/mounted', (req, res, next) => idempotent(async (_req, r) => void r.json({}))(req, res, next))
    // Express 4 leaves a rejected promise unhandled (the request would hang); the adapter passes it to `next`.
    app.post(
      '/optional-rejects',
      idempotent({ required: false }, async () => {
        throw Object.assign(new Error('teapot'), { statusCode: 418 })
      }),
    )
    // An optional parameter in each version's syntax; the template names the operation as written.
    app.post(
      framework === express4 ? '/items/:id?' : '/items{/:id}',
      idempotent(async (req, res) => {
        await insert(req)
        res.status(201).json({ id: req.params.id ?? null })
      }),
    )
    app.post(
      '/search',
      idempotent({ fingerprint: { query: true } }, async (req, res) => {
        await insert(req)
        res.status(201).json({ ok: true })
      }),
    )
    app.use(
      (error: { statusCode?: number }, _req: express.Request, res: express.Response, _next: unknown) => {
        res.status(error.statusCode ?? 500).json({ error: 'failed' })
      },
    )
    ;({ server, url } = await listen(app))
  })
  afterAll(() => close(server))

  const post = (path: string, key: string, body: unknown) =>
    fetch(`${url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify(body),
    })

  describe('what the handler writes is held, then sent or replayed', () => {
    it.each([
      ['writeHead, write and end', '/write-head', 202, 'part one, part two'],
      ['a stream piped into res', '/piped', 201, '{"streamed":true}'],
      ['res.json() from a callback after the handler returned', '/callback', 201, '{"late":true}'],
    ])('%s', async (_, path, status, text) => {
      const key = freshKey()
      const first = await post(path, key, { cart: key })
      const firstText = await first.text()
      const replay = await post(path, key, { cart: key })
      expect(first.status).toBe(status)
      expect(firstText).toBe(text)
      expect(replay.status).toBe(status)
      expect(await replay.text()).toBe(text)
      expect(replay.headers.get('idempotent-replayed')).toBe('true')
      expect(replay.headers.get('content-type')).toBe(first.headers.get('content-type'))
      expect(await effects(key)).toBe(1)
    })

    it("calls the handler's end() callback once the response is really sent", async () => {
      const before = endCallbacks
      const key = freshKey()
      await (await post('/write-head', key, { cart: key })).text()
      expect(endCallbacks - before).toBe(1)
    })

    it('an error passed to next() rolls back the writes and, when permanent, is stored and replayed', async () => {
      const key = freshKey()
      const before = runs
      const first = await post('/next-error', key, { cart: key })
      const replay = await post('/next-error', key, { cart: key })
      expect(first.status).toBe(402)
      expect(replay.status).toBe(402)
      expect(replay.headers.get('idempotent-replayed')).toBe('true')
      expect(runs - before).toBe(1)
      expect(await effects(key)).toBe(0)
    })

    it("next('route') hands on to the next route, whose response is held and stored", async () => {
      const key = freshKey()
      const first = await post('/next-route', key, { cart: key })
      const replay = await post('/next-route', key, { cart: key })
      expect(first.status).toBe(201)
      expect(await first.json()).toEqual({ from: 'the next route' })
      expect(replay.headers.get('idempotent-replayed')).toBe('true')
      expect(await effects(key)).toBe(1)
    })

    it('outside a route (app.use) it cannot name the operation: 500, and the log says to use it on a route', async () => {
      const res = await post('/mounted', freshKey(), {})
      expect(res.status).toBe(500)
      expect(res.headers.get('content-type')).toBe('application/problem+json')
      expect(errors.some((message) => message.includes('outside a route'))).toBe(true)
    })
  })

  // express.json() parses with JSON.parse: duplicate member names and integers beyond 2^53 pass (the last member wins,
  // the integer is rounded), and an empty body with a JSON content type is {}. Its bytes are gone by the time the
  // route runs, so they cannot be checked again: a body another parser read is refused, loudly.
  describe('a body parser in front of idempotent()', () => {
    let parsedUrl: string
    let parsedServer: ReturnType<express.Express['listen']>
    const logged: string[] = []
    let parsedRuns = 0
    beforeAll(async () => {
      const idempotent = idempotency({
        engine: engineFor(db.pool).engine,
        tenant: () => 'tenant_1',
        logger: { error: (_details, message) => logged.push(message) },
      })
      const app = framework()
      app.use(framework.json())
      app.post(
        '/global',
        idempotent(async (req, res) => {
          parsedRuns++
          res.status(201).json({ got: req.body })
        }),
      )
      ;({ server: parsedServer, url: parsedUrl } = await listen(app))
    })
    afterAll(() => close(parsedServer))
    const send = (body: string | undefined, headers: Record<string, string> = {}) =>
      fetch(`${parsedUrl}/global`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': freshKey(), ...headers },
        ...(body === undefined ? {} : { body }),
      })
    const refusals = () => logged.filter((message) => message.includes('read by another body parser'))

    it.each([
      ['duplicate member names', '{"cart":"a","cart":"b"}'],
      ['an integer beyond 2^53', '{"amount":9007199254740993}'],
      ['a well-formed body', '{"cart":"a"}'],
    ])(
      '%s, read by express.json(): 500 problem+json naming nothing internal, and nothing runs',
      async (_, body) => {
        const before = parsedRuns
        const res = await send(body)
        expect(res.status).toBe(500)
        expect(res.headers.get('content-type')).toBe('application/problem+json')
        expect(await res.json()).toMatchObject({ status: 500, detail: 'This route is not set up correctly.' })
        expect(parsedRuns).toBe(before)
      },
    )

    it('is logged once, at error level, with the fix', () => {
      expect(refusals()).toHaveLength(1)
      expect(refusals()[0]).toMatch(/POST \/global .*express\.json\(\).*after the idempotent routes/)
    })

    it('a POST without a body is checked as without the parser: an empty JSON body is 400, none at all runs', async () => {
      const before = parsedRuns
      const empty = await send(undefined)
      expect(empty.status).toBe(400)
      expect(await empty.json()).toMatchObject({ code: 'invalid_json' })
      expect(parsedRuns).toBe(before)
      const none = await fetch(`${parsedUrl}/global`, {
        method: 'POST',
        headers: { 'idempotency-key': freshKey() },
      })
      expect(none.status).toBe(201)
      expect(await none.json()).toEqual({})
      expect(parsedRuns).toBe(before + 1)
    })
  })

  describe('options', () => {
    const engine = () => engineFor(db.pool).engine

    it('are checked when the adapter and each route are set up, naming the option', () => {
      expect(() => idempotency({ engine: {} as never, tenant: () => 't' })).toThrow(
        /`engine` of @oncely\/server\/express/,
      )
      expect(() => idempotency({ engine: engine(), tenant: 't' as never })).toThrow(/`tenant`/)
      const idempotent = idempotency({ engine: engine(), tenant: () => 't' })
      expect(() => idempotent({ leaseMs: 0 }, async () => {})).toThrow(/`leaseMs` of `idempotent\(\)`/)
      expect(() => idempotent({ failOpen: true }, async () => {})).toThrow(/`failOpen` of `idempotent\(\)`/)
      expect(() => idempotent({ required: 'no' as never }, async () => {})).toThrow(
        'Expected `required` of `idempotent()` to be a boolean.',
      )
      expect(() => idempotent(null as never, async () => {})).toThrow(
        'Expected `options` of `idempotent()` to be true or an object.',
      )
      expect(() => idempotent({} as never)).toThrow(/Expected a route handler/)
    })

    it('type req.idempotency as present unless the route is optional', () => {
      const idempotent = idempotency({ engine: engine(), tenant: () => 't' })
      idempotent(async (req) => {
        expectTypeOf(req.idempotency).toEqualTypeOf<ExecutionContext>()
      })
      idempotent({ wait: { timeoutMs: 10 } }, async (req) => {
        expectTypeOf(req.idempotency).toEqualTypeOf<ExecutionContext>()
      })
      idempotent({ required: false }, async (req) => {
        expectTypeOf(req.idempotency).toEqualTypeOf<ExecutionContext | null>()
      })
    })
  })

  describe('what differs between Express 4 and 5', () => {
    it('a handler that rejects on an optional route called without a key reaches the error handler', async () => {
      const res = await fetch(`${url}/optional-rejects`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{}',
      })
      expect(res.status).toBe(418)
      expect(await res.json()).toEqual({ error: 'failed' })
    })

    it("an optional path parameter in the version's own syntax: the template names the operation", async () => {
      const template = framework === express4 ? '/items/:id?' : '/items{/:id}'
      const [bare, withId] = [freshKey(), freshKey()]
      const first = await post('/items', bare, { cart: bare })
      const second = await post('/items/7', withId, { cart: withId })
      expect([first.status, second.status]).toEqual([201, 201])
      expect(await second.json()).toEqual({ id: '7' })
      // Another resource of the same route with the same key is another request.
      expect((await post('/items/8', withId, { cart: withId })).status).toBe(422)
      const { rows } = await db.pool.query(
        'SELECT DISTINCT operation FROM oncely.idempotency_keys WHERE key = ANY($1)',
        [[bare, withId]],
      )
      expect(rows).toEqual([{ operation: `POST ${template}` }])
    })

    it("the query is fingerprinted as the URL has it, not as the version's parser reads it", async () => {
      const key = freshKey()
      const first = await post('/search?a[b]=1&tag=x&tag=y', key, { cart: key })
      expect(first.status).toBe(201)
      const encoded = await post('/search?a%5Bb%5D=1&tag=x&tag=y', key, { cart: key })
      expect(encoded.headers.get('idempotent-replayed')).toBe('true')
      expect((await post('/search?a[b]=2&tag=x&tag=y', key, { cart: key })).status).toBe(422)
      expect(await effects(key)).toBe(1)
    })
  })
})

// An app moved from Express 4 to 5 keeps its keys: the same request has the same operation and fingerprint on both,
// so a retry that reaches the upgraded server is replayed, not run again.
describe('one request on Express 4 and then on Express 5', () => {
  it('is replayed by the other version', async () => {
    const { engine } = engineFor(db.pool)
    const apps = [express4(), express()]
    const urls: string[] = []
    const servers: ReturnType<express.Express['listen']>[] = []
    let runs = 0
    for (const app of apps) {
      const idempotent = idempotency({ engine, tenant: () => 'tenant_1' })
      app.post(
        '/v1/accounts/:account/transfers',
        idempotent({ fingerprint: { query: true } }, async (req, res) => {
          runs++
          res.status(201).json({ account: req.params.account, query: req.query })
        }),
      )
      const { server, url } = await listen(app)
      servers.push(server)
      urls.push(url)
    }
    try {
      const key = freshKey()
      const send = (base: string) =>
        fetch(`${base}/v1/accounts/A/transfers?filter[kind]=card&x=1&x=2`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': key },
          body: JSON.stringify({ amount: 1 }),
        })
      const first = await send(urls[0]!)
      const second = await send(urls[1]!)
      expect([first.status, second.status]).toEqual([201, 201])
      expect(second.headers.get('idempotent-replayed')).toBe('true')
      expect(await second.text()).toBe(await first.text())
      expect(runs).toBe(1)
    } finally {
      await Promise.all(servers.map(close))
    }
  })
})
