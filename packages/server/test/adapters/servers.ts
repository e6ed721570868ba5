// The same small payments API on each adapter, over a real socket: bearer-token auth (the token is the tenant),
// one idempotent route that inserts a payment in the idempotency transaction, and a few routes for the edge cases.
// The contract suite runs the same cases against every one of them.

import type { Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { type ServerType, serve } from '@hono/node-server'
import Router from '@koa/router'
import express from 'express'
import express4 from 'express4'
import Fastify from 'fastify'
import { type Context, Hono } from 'hono'
import Koa from 'koa'
import type pg from 'pg'
import type { ExecutionContext } from '../../src/engine/types.js'
import { idempotency as expressIdempotency } from '../../src/express/index.js'
import { fastifyIdempotency } from '../../src/fastify/index.js'
import { idempotency as fetchIdempotency } from '../../src/fetch/index.js'
import type { IdempotencyRouteOptions } from '../../src/http/options.js'
import type { EngineEvent } from '../../src/index.js'
import { type KoaIdempotencyState, idempotency as koaIdempotency } from '../../src/koa/index.js'
import type { TestingEngineOptions } from '../../src/testing/index.js'
import { engineFor } from '../helpers.js'
import { type NestPlatform, nestApp } from './nest-apps.js'

export interface PaymentBody {
  cart: string
  amount: number
  decline?: boolean
  fail?: string
  big?: number
}

export interface LogLine {
  msg: string
  [field: string]: unknown
}

export interface RunningApp {
  url: string
  events: EngineEvent[]
  /** Error-level lines the adapter logged. */
  errors: LogLine[]
  close(): Promise<void>
}

export interface AppOptions {
  engine?: Partial<TestingEngineOptions>
  /** Paused inside the handler of /v1/slow until it resolves. */
  gate?: () => Promise<void>
}

export type AdapterName =
  | 'fastify'
  | 'express'
  | 'express 4'
  | 'koa'
  | 'fetch (Hono)'
  | 'nestjs (express)'
  | 'nestjs (fastify)'

/**
 * The adapters whose router matches the path as sent, without decoding it first: a percent-encoded spelling of a
 * route's path is no route of the app there (404).
 */
export const RAW_PATH_ROUTERS: ReadonlySet<AdapterName> = new Set([
  'express',
  'express 4',
  'koa',
  'nestjs (express)',
])

const PAYMENTS: IdempotencyRouteOptions = {
  required: true,
  fingerprint: { exclude: ['clientTime'] },
  maxBodyBytes: 1_024,
}
const NOTES: IdempotencyRouteOptions = { required: false }
const SLOW = {} satisfies IdempotencyRouteOptions
const WAITING = { wait: { timeoutMs: 5_000 } } satisfies IdempotencyRouteOptions

/** A tenant token of `none` makes `tenant` return undefined, as a misconfigured function would. */
const tenantOf = (authorization: string | undefined | null) =>
  authorization?.startsWith('Bearer ') ? authorization.slice('Bearer '.length) : undefined
const claimed = (tenant: string | undefined) =>
  tenant === 'none' ? (undefined as unknown as string) : tenant!

/**
 * What the payments handler sets on every response before it knows the outcome (a cookie, a header of its own): an
 * answer that replaces its response must carry neither. Handlers that write to a response object set them before the
 * business logic runs, so they are there when it throws.
 */
export const HANDLER_HEADERS = { 'set-cookie': 'session=abc', 'x-handler': 'ran' }
/** What the auth hook or middleware sets before any handler runs: it stays on every answer. */
export const HOOK_HEADER = ['x-request-id', 'req-1'] as const

/** The business logic, shared: what each adapter's handler does with `tx`. */
async function createPayment(
  ctx: ExecutionContext,
  tenant: string,
  body: PaymentBody,
  pool: pg.Pool,
): Promise<{ status: number; headers: Record<string, string>; body: unknown }> {
  if (body.fail === 'throw') throw Object.assign(new Error('provider timeout'), { statusCode: 504 })
  if (body.fail === 'terminate') {
    // The store goes away under the attempt after the handler answered: its commit cannot happen (503).
    const { rows } = await ctx.tx.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')
    // ::int: Citus adds a pg_terminate_backend(bigint) for its global pids, so an untyped parameter is ambiguous.
    await pool.query('SELECT pg_terminate_backend($1::int)', [rows[0]!.pid])
    return { status: 201, headers: {}, body: { terminated: true } }
  }
  if (body.decline) {
    throw Object.assign(new Error('Your card was declined.'), { statusCode: 402, code: 'card_declined' })
  }
  const { rows } = await ctx.tx.query(
    'INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, $3) RETURNING id',
    [tenant, body.cart, body.amount],
  )
  const id = rows[0].id as string
  if (body.big) return { status: 201, headers: {}, body: { id, padding: 'x'.repeat(body.big) } }
  return {
    status: 201,
    headers: { location: `/v1/payments/${id}`, etag: `"p${id}"` },
    body: { id, cart: body.cart, amount: body.amount },
  }
}

/**
 * A transfer out of `account` (a path parameter): the effect is booked for the cart and the account, so a transfer
 * that ran for the wrong account shows up under the other's name.
 */
async function transfer(ctx: ExecutionContext, tenant: string, account: string, body: PaymentBody) {
  await ctx.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, $3)', [
    tenant,
    `${body.cart}/${account}`,
    body.amount,
  ])
  return { status: 201, body: { account, cart: body.cart } }
}

async function slow(ctx: ExecutionContext, tenant: string, body: PaymentBody, gate?: () => Promise<void>) {
  await ctx.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, $3)', [
    tenant,
    body.cart,
    body.amount,
  ])
  await gate?.()
  return { status: 201, headers: {}, body: { cart: body.cart, attempt: ctx.attempt } }
}

/** The URL of a Node server once it listens, and how to close it. */
export async function listening(server: Server | ServerType): Promise<Pick<RunningApp, 'url' | 'close'>> {
  if (!server.listening) await new Promise<void>((resolve) => server.once('listening', resolve))
  const { port } = server.address() as AddressInfo
  return {
    url: `http://127.0.0.1:${port}`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  }
}

const errorSink = (errors: LogLine[]) => ({
  error: (details: Record<string, unknown>, msg: string) => errors.push({ ...details, msg }),
})

async function fastifyApp(pool: pg.Pool, options: AppOptions): Promise<RunningApp> {
  const { engine, events } = engineFor(pool, options.engine)
  const errors: LogLine[] = []
  const app = Fastify({
    logger: { level: 'error', stream: { write: (line: string) => errors.push(JSON.parse(line)) } },
  })
  app.decorateRequest('tenant', '')
  app.addHook('preHandler', async (request, reply) => {
    const tenant = tenantOf(request.headers.authorization)
    if (!tenant) return reply.code(401).send({ error: 'unauthorized' })
    ;(request as unknown as { tenant: string }).tenant = tenant
    reply.header(...HOOK_HEADER)
  })
  const tenant = (request: unknown) => claimed((request as { tenant: string }).tenant)
  await app.register(fastifyIdempotency, { engine, tenant })
  app.post<{ Body: PaymentBody }, { idempotency: { required: true } }>(
    '/v1/payments',
    { config: { idempotency: { ...PAYMENTS, required: true } } },
    async (request, reply) => {
      reply.headers(HANDLER_HEADERS)
      const result = await createPayment(request.idempotency, tenant(request), request.body, pool)
      return reply.code(result.status).headers(result.headers).send(result.body)
    },
  )
  for (const [path, config] of [
    ['/v1/slow', SLOW],
    ['/v1/waiting', WAITING],
  ] as const) {
    app.post<{ Body: PaymentBody }, { idempotency: typeof config }>(
      path,
      { config: { idempotency: config } },
      async (request, reply) => {
        const result = await slow(request.idempotency, tenant(request), request.body, options.gate)
        return reply.code(result.status).send(result.body)
      },
    )
  }
  app.post('/v1/notes', { config: { idempotency: NOTES } }, async (request) => {
    await request.idempotency?.tx.query('SELECT 1')
    return { ok: true, keyed: request.idempotency !== null }
  })
  app.post<{ Body: PaymentBody; Params: { account: string } }, { idempotency: true }>(
    '/v1/accounts/:account/transfers',
    { config: { idempotency: true } },
    async (request, reply) => {
      const result = await transfer(
        request.idempotency,
        tenant(request),
        request.params.account,
        request.body,
      )
      return reply.code(result.status).send(result.body)
    },
  )
  app.post<{ Body: PaymentBody }, { idempotency: true }>(
    '/v1/orders',
    { config: { idempotency: true } },
    async (request, reply) => {
      const result = await transfer(request.idempotency, tenant(request), 'orders', request.body)
      return reply.code(result.status).send(result.body)
    },
  )
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as AddressInfo
  return { url: `http://127.0.0.1:${port}`, events, errors, close: () => app.close() }
}

/** The same app on Express 5 (`express`) or Express 4 (`express4`). */
async function expressApp(pool: pg.Pool, options: AppOptions, framework = express): Promise<RunningApp> {
  const { engine, events } = engineFor(pool, options.engine)
  const errors: LogLine[] = []
  const app = framework()
  app.use((req, res, next) => {
    const tenant = tenantOf(req.get('authorization'))
    if (!tenant) return void res.status(401).json({ error: 'unauthorized' })
    res.locals.tenant = tenant
    res.setHeader(...HOOK_HEADER)
    next()
  })
  const tenant = (req: express.Request) => claimed(req.res?.locals.tenant)
  const idempotent = expressIdempotency({ engine, tenant, logger: errorSink(errors) })
  app.post(
    '/v1/payments',
    idempotent({ ...PAYMENTS, required: true }, async (req, res) => {
      res.set(HANDLER_HEADERS)
      const result = await createPayment(req.idempotency, tenant(req), req.body, pool)
      res.status(result.status).set(result.headers).json(result.body)
    }),
  )
  for (const [path, config] of [
    ['/v1/slow', SLOW],
    ['/v1/waiting', WAITING],
  ] as const) {
    app.post(
      path,
      idempotent(config, async (req, res) => {
        const result = await slow(req.idempotency, tenant(req), req.body, options.gate)
        res.status(result.status).json(result.body)
      }),
    )
  }
  app.post(
    '/v1/notes',
    idempotent(NOTES, async (req, res) => {
      await req.idempotency?.tx.query('SELECT 1')
      res.json({ ok: true, keyed: req.idempotency !== null })
    }),
  )
  app.post(
    '/v1/accounts/:account/transfers',
    idempotent(async (req, res) => {
      const result = await transfer(req.idempotency, tenant(req), String(req.params.account), req.body)
      res.status(result.status).json(result.body)
    }),
  )
  app.post(
    '/v1/orders',
    idempotent(async (req, res) => {
      const result = await transfer(req.idempotency, tenant(req), 'orders', req.body)
      res.status(result.status).json(result.body)
    }),
  )
  // Express's default error handler prints the stack; an error page with the status is all the tests need.
  app.use((error: { statusCode?: number }, _req: express.Request, res: express.Response, _next: unknown) => {
    res.status(error.statusCode ?? 500).json({ error: 'failed' })
  })
  return { events, errors, ...(await listening(app.listen(0, '127.0.0.1'))) }
}

async function koaApp(pool: pg.Pool, options: AppOptions): Promise<RunningApp> {
  const { engine, events } = engineFor(pool, options.engine)
  const errors: LogLine[] = []
  const app = new Koa<{ tenant: string }>()
  app.use(async (ctx, next) => {
    const tenant = tenantOf(ctx.get('authorization'))
    if (!tenant) {
      ctx.status = 401
      ctx.body = { error: 'unauthorized' }
      return
    }
    ctx.state.tenant = tenant
    ctx.set(...HOOK_HEADER)
    // Koa's own error handling clears every header; an error page with the status is all the tests need.
    try {
      await next()
    } catch (error) {
      ctx.status = (error as { statusCode?: number }).statusCode ?? 500
      ctx.body = { error: 'failed' }
    }
  })
  const tenant = (ctx: { state: { tenant?: string } }) => claimed(ctx.state.tenant)
  const idempotent = koaIdempotency({ engine, tenant, logger: errorSink(errors) })
  type State = KoaIdempotencyState & { tenant: string }
  const router = new Router<{ tenant: string }>()
  router.post<State>('/v1/payments', idempotent({ ...PAYMENTS, required: true }), async (ctx) => {
    ctx.set(HANDLER_HEADERS)
    const result = await createPayment(
      ctx.state.idempotency,
      tenant(ctx),
      ctx.state.body as PaymentBody,
      pool,
    )
    ctx.status = result.status
    ctx.set(result.headers)
    ctx.body = result.body
  })
  for (const [path, config] of [
    ['/v1/slow', SLOW],
    ['/v1/waiting', WAITING],
  ] as const) {
    router.post<State>(path, idempotent(config), async (ctx) => {
      const result = await slow(
        ctx.state.idempotency,
        tenant(ctx),
        ctx.state.body as PaymentBody,
        options.gate,
      )
      ctx.status = result.status
      ctx.body = result.body
    })
  }
  router.post<KoaIdempotencyState<ExecutionContext | null>>('/v1/notes', idempotent(NOTES), async (ctx) => {
    await ctx.state.idempotency?.tx.query('SELECT 1')
    ctx.body = { ok: true, keyed: ctx.state.idempotency !== null }
  })
  router.post<State>('/v1/accounts/:account/transfers', idempotent(), async (ctx) => {
    const body = ctx.state.body as PaymentBody
    const result = await transfer(ctx.state.idempotency, tenant(ctx), String(ctx.params.account), body)
    ctx.status = result.status
    ctx.body = result.body
  })
  router.post<State>('/v1/orders', idempotent(), async (ctx) => {
    const result = await transfer(ctx.state.idempotency, tenant(ctx), 'orders', ctx.state.body as PaymentBody)
    ctx.status = result.status
    ctx.body = result.body
  })
  app.use(router.routes())
  return { events, errors, ...(await listening(app.listen(0, '127.0.0.1'))) }
}

type HonoEnv = { Variables: { tenant: string } }

async function honoApp(pool: pg.Pool, options: AppOptions): Promise<RunningApp> {
  const { engine, events } = engineFor(pool, options.engine)
  const errors: LogLine[] = []
  const app = new Hono<HonoEnv>()
  app.use(async (c, next) => {
    const tenant = tenantOf(c.req.header('authorization'))
    if (!tenant) return c.json({ error: 'unauthorized' }, 401)
    c.set('tenant', tenant)
    // On Hono's response, as hono/cors sets its headers, so Hono copies it onto whatever Response the route returns.
    c.res.headers.set(...HOOK_HEADER)
    await next()
  })
  const idempotent = fetchIdempotency({
    engine,
    tenant: (_request, c: { get(name: 'tenant'): string }) => claimed(c.get('tenant')),
    logger: errorSink(errors),
  })
  const payments = idempotent({ ...PAYMENTS, required: true }, async (_request, { body, idempotency }, c) => {
    const result = await createPayment(idempotency, c.get('tenant'), body as PaymentBody, pool)
    return Response.json(result.body, {
      status: result.status,
      headers: { ...HANDLER_HEADERS, ...result.headers },
    })
  })
  for (const [path, config] of [
    ['/v1/slow', SLOW],
    ['/v1/waiting', WAITING],
  ] as const) {
    const handler = idempotent({ ...config, route: path }, async (_request, { body, idempotency }, c) => {
      const result = await slow(idempotency, c.get('tenant'), body as PaymentBody, options.gate)
      return Response.json(result.body, { status: result.status })
    })
    app.post(path, (c) => handler(c.req.raw, c))
  }
  const notes = idempotent(NOTES, async (_request, { idempotency }) => {
    await idempotency?.tx.query('SELECT 1')
    return Response.json({ ok: true, keyed: idempotency !== null })
  })
  // With `route`, the template names the operation; without it, the request's path does (as Hono matched it).
  const transfers = idempotent(
    { route: '/v1/accounts/:account/transfers' },
    async (_request, { body, idempotency }, c) => {
      const account = (c as unknown as Context).req.param('account') as string
      const result = await transfer(idempotency, c.get('tenant'), account, body as PaymentBody)
      return Response.json(result.body, { status: result.status })
    },
  )
  const orders = idempotent(async (_request, { body, idempotency }, c) => {
    const result = await transfer(idempotency, c.get('tenant'), 'orders', body as PaymentBody)
    return Response.json(result.body, { status: result.status })
  })
  app.post('/v1/payments', (c) => payments(c.req.raw, c))
  app.post('/v1/notes', (c) => notes(c.req.raw, c))
  app.post('/v1/accounts/:account/transfers', (c) => transfers(c.req.raw, c))
  app.post('/v1/orders', (c) => orders(c.req.raw, c))
  app.onError((error, c) =>
    c.json({ error: 'failed' }, ((error as { statusCode?: number }).statusCode ?? 500) as 500),
  )
  return { events, errors, ...(await listening(serve({ fetch: app.fetch, port: 0, hostname: '127.0.0.1' }))) }
}

export const adapters: Record<AdapterName, (pool: pg.Pool, options?: AppOptions) => Promise<RunningApp>> = {
  fastify: (pool, options = {}) => fastifyApp(pool, options),
  express: (pool, options = {}) => expressApp(pool, options),
  'express 4': (pool, options = {}) => expressApp(pool, options, express4),
  koa: (pool, options = {}) => koaApp(pool, options),
  'fetch (Hono)': (pool, options = {}) => honoApp(pool, options),
  'nestjs (express)': (pool, options = {}) => nestAppOn('express', pool, options),
  'nestjs (fastify)': (pool, options = {}) => nestAppOn('fastify', pool, options),
}

/** The same API as a NestJS application (test/adapters/nest-apps.ts), given this file's handlers. */
function nestAppOn(platform: NestPlatform, pool: pg.Pool, options: AppOptions): Promise<RunningApp> {
  return nestApp(platform, options, {
    pool,
    createPayment: createPayment as never,
    transfer: transfer as never,
    slow: slow as never,
    routes: { payments: PAYMENTS, notes: NOTES, slow: SLOW, waiting: WAITING },
    handlerHeaders: HANDLER_HEADERS,
    hookHeader: HOOK_HEADER,
    tenantOf,
    claimed,
  })
}
