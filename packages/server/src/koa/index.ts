import type { Readable } from 'node:stream'
import type { Context, Middleware, Next, ParameterizedContext } from 'koa'
import type pg from 'pg'
import type { ExecutionContext, HandlerResponse } from '../engine/types.js'
import { standaloneAdapter } from '../http/adapter.js'
import type { Answer, ResponseWriter } from '../http/answer.js'
import { PASS, type Verdict } from '../http/core.js'
import { HeldResponse } from '../http/held.js'
import { nodeAdmission, sendRefusal } from '../http/node.js'
import { type IdempotencyRouteOptions, resolveRoute, type StandaloneAdapterOptions } from '../http/options.js'

const ADAPTER = '@oncely/server/koa'
// Statuses Koa sends without a body (its `statuses.empty`).
const EMPTY_STATUSES = new Set([204, 205, 304])

/**
 * Options of {@link idempotency}: `engine`, `tenant(ctx)` and `logger`. `Tx` is the transaction type of the engine's
 * datasource, inferred from `engine`.
 */
export type KoaIdempotencyOptions<Tx = pg.PoolClient> = StandaloneAdapterOptions<Context, [], Tx>

/**
 * What the middleware puts on `ctx.state`: `idempotency`, the execution context (`tx`, `key`, ...), for the
 * middleware after it. Name it as the router's state type: `router.post<KoaIdempotencyState>(path, idempotent(),
 * ...)`, with your datasource's transaction when it is not node-postgres's:
 * `KoaIdempotencyState<ExecutionContext<Transaction<DB>>>`.
 */
export interface KoaIdempotencyState<Context extends ExecutionContext<unknown> | null = ExecutionContext> {
  /** The execution context: `tx` (the business transaction), `key`, `stepKey()`, ... */
  idempotency: Context
  /**
   * The JSON body, read once and parsed strictly (`undefined` without one); also on `ctx.request.body`, where body
   * parsers put it, but typed there only by their own declarations.
   */
  body: unknown
}

/**
 * Makes the middleware after it on one route idempotent; see {@link idempotency}. `ctx.state.idempotency.tx` is a
 * `Tx`, the transaction type of the engine's datasource.
 */
export interface KoaIdempotent<Tx = pg.PoolClient> {
  (
    options?: IdempotencyRouteOptions & { required?: true },
  ): Middleware<KoaIdempotencyState<ExecutionContext<Tx>>>
  (options: IdempotencyRouteOptions): Middleware<KoaIdempotencyState<ExecutionContext<Tx> | null>>
}

/** The route @koa/router matched: the layer's path, with the prefixes of the routers it is mounted in. */
interface RouterFields {
  routerPath?: unknown
  _matchedRoute?: unknown
}

const writer: ResponseWriter<Context> = {
  status: (ctx, code) => {
    ctx.status = code
  },
  setHeader: (ctx, name, value) =>
    ctx.set(name, typeof value === 'number' ? String(value) : (value as string)),
  removeHeader: (ctx, name) => ctx.remove(name),
  headers: (ctx) => ctx.response.headers as Record<string, string | string[] | number | undefined>,
}

/** Reads what Koa would send for `ctx.body` (a string, bytes, a stream, JSON or nothing) into bytes. */
async function bodyBytes(ctx: Context): Promise<Buffer> {
  const body: unknown = ctx.body
  if (body === null || body === undefined) {
    if (EMPTY_STATUSES.has(ctx.status)) return Buffer.alloc(0)
    // Koa answers a response without a body with its status message as text.
    ctx.body = ctx.message || String(ctx.status)
    return Buffer.from(ctx.body as string)
  }
  if (Buffer.isBuffer(body)) return body
  if (typeof body === 'string') return Buffer.from(body)
  if (body instanceof Uint8Array) return Buffer.from(body)
  if (typeof (body as Readable).pipe === 'function') {
    const chunks: Buffer[] = []
    for await (const chunk of body as Readable)
      chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk))
    return Buffer.concat(chunks)
  }
  return Buffer.from(JSON.stringify(body))
}

/** Sends `bytes` as the body, keeping the status and the headers set; none for a status that has no body. */
function sendBytes(ctx: Context, bytes: Buffer): void {
  if (EMPTY_STATUSES.has(ctx.status)) {
    ctx.body = null
    return
  }
  const type = ctx.response.get('content-type')
  ctx.body = bytes
  // Koa types bytes as application/octet-stream when nothing named a type; the response had none.
  if (!type) ctx.remove('content-type')
}

/**
 * The Koa adapter (Koa 2 and 3, with @koa/router). `idempotency(options)` returns `idempotent`, which makes a
 * middleware: put it on a route before the route's handler. It reads and checks the JSON body
 * (`ctx.request.body`), runs what follows it on the route inside the transaction that also completes the key
 * record (`ctx.state.idempotency.tx`) and, because Koa writes the response only once every middleware returned,
 * holds what the handler sets on `ctx` (`ctx.status`, `ctx.body`, headers) until that commit; a retry with the
 * same `Idempotency-Key` gets the stored response. An error the handler throws is classified: a permanent one is
 * stored and replayed, anything else releases the key and propagates to your error handling.
 *
 * The JSON body is read and parsed strictly by the middleware itself: mount koa-bodyparser (or @koa/bodyparser) on
 * other routes only. A request whose body another parser already read is refused (500 problem+json; the log says
 * how to fix it, once per route). The handler must answer through `ctx`, not by writing to `ctx.res`.
 *
 * @example
 * const idempotent = idempotency({ engine, tenant: (ctx) => ctx.state.accountId })
 * router.post<KoaIdempotencyState>('/v1/payments', idempotent(), async (ctx) => {
 *   const { rows } = await ctx.state.idempotency.tx.query('INSERT INTO payments (amount) VALUES ($1) RETURNING id', [100])
 *   ctx.status = 201
 *   ctx.body = { id: rows[0].id }
 * })
 */
export function idempotency<Tx = pg.PoolClient>(options: KoaIdempotencyOptions<Tx>): KoaIdempotent<Tx> {
  const { tenant, log, core, policy } = standaloneAdapter(options, ADAPTER)
  const admit = nodeAdmission(policy, log, {
    consumed:
      'idempotent() reads and parses the JSON body itself: mount the body parser only on the routes that are not idempotent (`router.post(path, bodyParser(), handler)`), not with `app.use()` in front of them.',
    misplaced: `idempotent() ran outside a route of @koa/router (app.use?), so it cannot name the operation. Use it on a route, \`router.post('/v1/payments', idempotent(), handler)\`, or give \`operation\`.`,
  })

  function idempotent(
    routeOptions?: IdempotencyRouteOptions,
  ): Middleware<KoaIdempotencyState<ExecutionContext<Tx> | null>> {
    if (typeof routeOptions === 'function') {
      throw new TypeError(
        'Expected the options of `idempotent()` (or nothing), not a handler: `router.post(path, idempotent(), handler)`.',
      )
    }
    const route = resolveRoute(routeOptions, { of: '`idempotent()`' })

    return async function idempotentMiddleware(
      ctx: ParameterizedContext<KoaIdempotencyState<ExecutionContext<Tx> | null>>,
      next: Next,
    ): Promise<void> {
      ctx.state.idempotency = null
      const matched = (ctx as RouterFields).routerPath ?? (ctx as RouterFields)._matchedRoute
      const template = typeof matched === 'string' ? matched : undefined
      const where = () => `${ctx.method} ${template ?? ctx.path}`
      // Koa writes the response once every middleware returned: what the handler set on ctx is held until then.
      const held = new HeldResponse(writer, ctx as unknown as Context)
      const answer = (value: Answer) => {
        if (value.own) return
        sendBytes(ctx as unknown as Context, held.replace(value))
      }
      const admitted = await admit(route, {
        raw: ctx.req,
        method: ctx.method,
        target: ctx.originalUrl,
        template,
        where,
        received: (body) => {
          ctx.state.body = body
          ;(ctx.request as { body?: unknown }).body = body
        },
      })
      if (!admitted.ok) {
        if ('answer' in admitted) return answer(admitted.answer)
        // Refused before the body is read to its end: the answer goes out now and the rest is discarded.
        ctx.respond = false
        return sendRefusal(ctx.req, ctx.res, admitted.refusal)
      }

      let verdict: Verdict
      try {
        verdict = await core.handle(route, {
          ...admitted.exchange,
          tenant: () => tenant(ctx as unknown as Context),
          log,
          run: (execution) =>
            held.runReturning(async (): Promise<HandlerResponse> => {
              ctx.state.idempotency = execution
              await next()
              if (ctx.respond === false || ctx.res.headersSent) {
                throw new TypeError(
                  `Expected the handler of an idempotent route (${where()}) to answer through ctx.body and ctx.status; it wrote to ctx.res, which cannot be held until the commit nor stored.`,
                )
              }
              const bytes = await bodyBytes(ctx as unknown as Context)
              sendBytes(ctx as unknown as Context, bytes)
              // The headers as set (lower-case names): the engine serialises the ones it stores, once.
              return { status: ctx.status, headers: ctx.response.headers, body: bytes }
            }),
        })
      } catch (error) {
        // The handler threw a retryable error (its writes rolled back): the error page carries none of its headers.
        held.undo()
        throw error
      }
      if (verdict === PASS) return next()
      answer(verdict)
    }
  }
  return idempotent as KoaIdempotent<Tx>
}

export type { AdapterLogger, FingerprintOptions, IdempotencyRouteOptions } from '../http/options.js'
