// What only the Fetch-API adapter has: the handler's Response (empty bodies, headers), the body read once, the
// route template, its option checks and types. Called here with plain Request objects, as Next.js, Bun and Deno do;
// the shared HTTP contract (under Hono on a real socket) is in contract.test.ts.
import type { TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, expectTypeOf, it } from 'vitest'
import type { ExecutionContext } from '../../src/engine/types.js'
import { idempotency } from '../../src/fetch/index.js'
import { engineFor, freshKey, reservation, setupDatabase } from '../helpers.js'

let db: TestDatabase
const errors: string[] = []
let idempotent: ReturnType<typeof idempotency<[]>>
beforeAll(async () => {
  db = await setupDatabase('fetch')
  idempotent = idempotency({
    engine: engineFor(db.pool).engine,
    tenant: (request) => request.headers.get('x-test-tenant') ?? 'tenant_1',
    logger: { error: (_details, message) => errors.push(message) },
  })
})
afterAll(async () => {
  await db?.drop()
})

const request = (path: string, key: string, body?: unknown, method = 'POST') =>
  new Request(`http://test${path}`, {
    method,
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })

describe('the handler and its Response', () => {
  it('replays an empty 204 (a status whose Response may not have a body)', async () => {
    let runs = 0
    const handler = idempotent(async () => {
      runs++
      return new Response(null, { status: 204, headers: { etag: '"v1"' } })
    })
    const key = freshKey()
    const first = await handler(request('/v1/things/1', key, { on: true }))
    const replay = await handler(request('/v1/things/1', key, { on: true }))
    expect([first.status, replay.status]).toEqual([204, 204])
    expect(replay.headers.get('etag')).toBe('"v1"')
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expect(runs).toBe(1)
  })

  it('hands the body over parsed, and keeps every header of the first response (set-cookie too)', async () => {
    const handler = idempotent(async (_request, { body }) => {
      const headers = new Headers({ 'set-cookie': 'a=1' })
      headers.append('set-cookie', 'b=2')
      return Response.json({ got: body }, { status: 201, headers })
    })
    const key = freshKey()
    const first = await handler(request('/v1/echo', key, { n: 1 }))
    expect(await first.json()).toEqual({ got: { n: 1 } })
    expect(first.headers.getSetCookie()).toEqual(['a=1', 'b=2'])
    const replay = await handler(request('/v1/echo', key, { n: 1 }))
    expect(replay.headers.getSetCookie()).toEqual([])
  })

  it('names the operation after the decoded request path by default, and after `route` when given', async () => {
    let runs = 0
    const byPath = idempotent(async () => Response.json({ run: ++runs }))
    const byRoute = idempotent({ route: '/v1/orders/:id' }, async (req) =>
      Response.json({ run: ++runs, path: new URL(req.url).pathname }),
    )
    const key = freshKey()
    await byPath(request('/v1/orders/1', key, {}))
    expect((await byPath(request('/v1/orders/2', key, {}))).headers.get('idempotent-replayed')).toBeNull()
    // Another spelling of the same path, as a router decodes it: the same operation, replayed.
    expect((await byPath(request('/v1/%6Frders/%31', key, {}))).headers.get('idempotent-replayed')).toBe(
      'true',
    )
    const other = freshKey()
    await byRoute(request('/v1/orders/1', other, {}))
    // One operation, but another resource: the path's parameter values are part of the fingerprint.
    const otherOrder = await byRoute(request('/v1/orders/2', other, {}))
    expect(otherOrder.status).toBe(422)
    expect((await byRoute(request('/v1/orders/%31', other, {}))).headers.get('idempotent-replayed')).toBe(
      'true',
    )
    expect(runs).toBe(3)
    const { rows } = await db.pool.query(
      'SELECT operation FROM oncely.idempotency_keys WHERE key = ANY($1)',
      [[key, other]],
    )
    expect(rows.map((r) => r.operation).sort()).toEqual([
      'POST /v1/orders/1',
      'POST /v1/orders/2',
      'POST /v1/orders/:id',
    ])
  })

  it('counts the query only with fingerprint.query', async () => {
    const handler = idempotent({ fingerprint: { query: true } }, async () => Response.json({}))
    const key = freshKey()
    await handler(request('/v1/search?q=a', key, {}))
    expect((await handler(request('/v1/search?q=b', key, {}))).status).toBe(422)
  })

  it('a handler that returns no Response is a retryable error, rethrown to the framework', async () => {
    const handler = idempotent((async () => ({ not: 'a response' })) as never)
    const key = freshKey()
    await expect(handler(request('/v1/bad', key, {}))).rejects.toThrow(/to return a Response/)
    const { rows } = await db.pool.query('SELECT status FROM oncely.idempotency_keys WHERE key = $1', [key])
    // Released: the row protocol keeps the row as failed_retryable; the lock protocol's attempt left none.
    expect(rows[0]?.status).toBe(reservation === 'row' ? 'failed_retryable' : undefined)
  })
})

describe('misuse fails loudly', () => {
  it('a body read before the handler: 500 problem, and the log says why', async () => {
    const handler = idempotent(async () => Response.json({}))
    const req = request('/v1/read-early', freshKey(), { a: 1 })
    await req.text()
    const res = await handler(req)
    expect(res.status).toBe(500)
    expect(res.headers.get('content-type')).toBe('application/problem+json')
    expect(errors.some((message) => message.includes('was read by another body parser'))).toBe(true)
  })

  it('a GET: 500 problem, and the log says to export it for unsafe methods only', async () => {
    const handler = idempotent(async () => Response.json({}))
    const res = await handler(request('/v1/list', freshKey(), undefined, 'GET'))
    expect(res.status).toBe(500)
    expect(
      errors.some((message) =>
        /refused a GET request: safe methods are never idempotency-checked/.test(message),
      ),
    ).toBe(true)
  })

  it('options are checked when the adapter and each handler are set up', () => {
    const engine = engineFor(db.pool).engine
    expect(() => idempotency({ engine, tenant: undefined as never })).toThrow(
      'Expected `tenant` of @oncely/server/fetch to be a function. It gets the request and returns the tenant id.',
    )
    expect(() => idempotency({ engine, tenant: () => 't', logger: { info: () => {} } as never })).toThrow(
      /`logger` of @oncely\/server\/fetch to be a logger/,
    )
    expect(() => idempotent({ route: '' }, async () => Response.json({}))).toThrow(
      'Expected `route` of `idempotent()` to be a non-empty string. It is the route template, such as /v1/orders/:id.',
    )
    expect(() =>
      idempotent({ requestHeaders: 'user-agent' as never }, async () => Response.json({})),
    ).toThrow(/`requestHeaders` of `idempotent\(\)` to be an array of header names/)
    expect(() => idempotent({ maxBodyBytes: 1.5 }, async () => Response.json({}))).toThrow(/`maxBodyBytes`/)
  })

  it('types the context as present unless the route is optional, and passes the extra arguments on', () => {
    const withContext = idempotency({
      engine: engineFor(db.pool).engine,
      tenant: (_request, c: { tenant: string }) => c.tenant,
    })
    const handler = withContext(async (_request, { idempotency: ctx }, c) => {
      expectTypeOf(ctx).toEqualTypeOf<ExecutionContext>()
      expectTypeOf(c).toEqualTypeOf<{ tenant: string }>()
      return Response.json({})
    })
    expectTypeOf(handler).parameters.toEqualTypeOf<[Request, { tenant: string }]>()
    withContext({ required: false }, async (_request, { idempotency: ctx }) => {
      expectTypeOf(ctx).toEqualTypeOf<ExecutionContext | null>()
      return Response.json({})
    })
  })
})
