import type pg from 'pg'
import type { ExecutionContext, HandlerResponse } from '../engine/types.js'
import { standaloneAdapter } from '../http/adapter.js'
import { problemAnswer, type Replacement, type ReplacingAnswer, replacementHeaders } from '../http/answer.js'
import { PASS } from '../http/core.js'
import {
  type IdempotencyRouteOptions,
  routeArguments,
  type StandaloneAdapterOptions,
} from '../http/options.js'
import { earlyRefusal } from '../http/policy.js'
import { type ChunkSource, refuse } from '../http/refusal.js'
import {
  type BodyResult,
  DEFAULT_MAX_BODY_BYTES,
  decodePath,
  type HeaderReader,
  isSafeMethod,
  parseBody,
  parseBodyText,
  payloadTooLarge,
  queryOf,
} from '../http/request.js'
import { nonEmptyString } from '../options/check.js'

const ADAPTER = '@oncely/server/fetch'
// Statuses whose response may not have a body (the Response constructor throws for one).
const NULL_BODY_STATUSES = new Set([101, 103, 204, 205, 304])

/**
 * Options of {@link idempotency}. `Args` are the arguments your server passes after the `Request` (Hono's context,
 * Next.js's `{ params }`), which `tenant` and your handlers also receive. `Tx` is the transaction type of the
 * engine's datasource, inferred from `engine`.
 */
export type FetchIdempotencyOptions<
  Args extends unknown[] = [],
  Tx = pg.PoolClient,
> = StandaloneAdapterOptions<Request, Args, Tx>

/** Options of one idempotent handler: the route options, and the route template. */
export interface FetchRouteOptions extends IdempotencyRouteOptions {
  /**
   * The route template, part of the operation and the fingerprint, such as `/v1/orders/:id/refunds`. The request's
   * decoded path (`/v1/orders/42/refunds`) counts toward the fingerprint either way, so the same key on another
   * order is a 422.
   * @default the request's path, percent-decoded as Hono's router matches it, such as `/v1/orders/42/refunds` (so
   * each order is its own operation)
   * @example
   * { route: '/v1/orders/:id/refunds' }
   */
  route?: string
}

/** What an idempotent handler receives after the `Request`. */
export interface FetchIdempotencyContext<
  Context extends ExecutionContext<unknown> | null = ExecutionContext,
> {
  /**
   * The JSON body, read once and parsed strictly before the handler (`undefined` without one). The request's own
   * body stream is used up: read this instead of `request.json()`.
   */
  body: unknown
  /** The execution context: `tx` (the business transaction), `key`, `stepKey()`, ... */
  idempotency: Context
}

/** A Fetch-API handler made idempotent. */
export type FetchIdempotentHandler<
  Args extends unknown[],
  Context extends ExecutionContext<unknown> | null = ExecutionContext,
> = (
  request: Request,
  context: FetchIdempotencyContext<Context>,
  ...args: Args
) => Response | Promise<Response>

/**
 * Makes one Fetch-API handler idempotent; see {@link idempotency}. Its handler's `idempotency.tx` is a `Tx`, the
 * transaction type of the engine's datasource.
 */
export interface FetchIdempotent<Args extends unknown[] = [], Tx = pg.PoolClient> {
  (
    handler: FetchIdempotentHandler<Args, ExecutionContext<Tx>>,
  ): (request: Request, ...args: Args) => Promise<Response>
  (
    options: FetchRouteOptions & { required?: true },
    handler: FetchIdempotentHandler<Args, ExecutionContext<Tx>>,
  ): (request: Request, ...args: Args) => Promise<Response>
  (
    options: FetchRouteOptions,
    handler: FetchIdempotentHandler<Args, ExecutionContext<Tx> | null>,
  ): (request: Request, ...args: Args) => Promise<Response>
}

/** A body over the limit, refused with the rest of it still to read. */
type TooLarge = { ok: false; tooLarge: true; rest: ChunkSource }

async function readBody(
  reader: ReadableStreamDefaultReader<Uint8Array> | undefined,
  limit: number,
  header: HeaderReader,
): Promise<BodyResult | TooLarge> {
  if (reader === undefined) return parseBody(new Uint8Array(0), header)
  const chunks: Uint8Array[] = []
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    size += value.byteLength
    // Not cancelled: on Node servers that resets the connection before the answer is out (see `refuse`).
    if (size > limit) return { ok: false, tooLarge: true, rest: () => reader.read() }
    chunks.push(value)
  }
  return parseBody(Buffer.concat(chunks, size), header)
}

/** Hono's request (`c.req`), as far as the adapter reads it: the raw Request, and the body it cached once read. */
interface HonoRequestLike {
  raw: Request
  bodyCache: { arrayBuffer?: Promise<ArrayBuffer>; blob?: Promise<Blob>; text?: Promise<string> }
}

/**
 * The body Hono read before the handler (its `validator('json')`, `c.req.json()`, `c.req.arrayBuffer()`), from the
 * cache on Hono's request, found through the context passed after the `Request`: the bytes when Hono kept them, else
 * the text it decoded. `undefined` when nothing there holds it.
 */
async function cachedBody(
  request: Request,
  args: readonly unknown[],
): Promise<{ bytes: Uint8Array } | { text: string } | undefined> {
  for (const arg of args) {
    const req = (arg as { req?: Partial<HonoRequestLike> } | null | undefined)?.req
    if (req?.raw !== request || typeof req.bodyCache !== 'object' || req.bodyCache === null) continue
    const cache = req.bodyCache
    if (cache.arrayBuffer) return { bytes: new Uint8Array(await cache.arrayBuffer) }
    if (cache.blob) return { bytes: new Uint8Array(await (await cache.blob).arrayBuffer()) }
    if (cache.text) return { text: await cache.text }
  }
  return undefined
}

/** Refuses a request before its body is read to its end, discarding the rest (see `refuse`). */
function refusalResponse(answer: ReplacingAnswer, rest: ChunkSource | undefined): Response {
  const refusal = refuse(answer, rest)
  return new Response(refusal.body, { status: refusal.status, headers: refusal.headers })
}

const toResponse = (answer: Replacement) =>
  new Response(NULL_BODY_STATUSES.has(answer.status) ? null : new Uint8Array(answer.body), {
    status: answer.status,
    headers: replacementHeaders(answer),
  })

/**
 * The Fetch-API adapter, for every server whose handlers take a `Request` and return a `Response`: Hono, Next.js
 * route handlers, Bun.serve, Deno.serve, Remix, SvelteKit. `idempotency(options)` returns `idempotent`, which
 * wraps a handler: the body is read once, checked and fingerprinted, the handler runs inside the transaction that
 * also completes the key record, and its `Response` is returned only after that commit; a retry with the same
 * `Idempotency-Key` gets the stored response.
 *
 * @example
 * const idempotent = idempotency({ engine, tenant: (request) => request.headers.get('x-tenant') ?? '' })
 * export const POST = idempotent(async (request, { body, idempotency }) => {
 *   const { rows } = await idempotency.tx.query('INSERT INTO payments (amount) VALUES ($1) RETURNING id', [100])
 *   return Response.json({ id: rows[0].id }, { status: 201 })
 * })
 */
export function idempotency<Args extends unknown[] = [], Tx = pg.PoolClient>(
  options: FetchIdempotencyOptions<Args, Tx>,
): FetchIdempotent<Args, Tx> {
  const { tenant, log, core, policy } = standaloneAdapter(options, ADAPTER)

  function idempotent(
    optionsOrHandler: FetchRouteOptions | FetchIdempotentHandler<Args, ExecutionContext<Tx> | null>,
    maybeHandler?: FetchIdempotentHandler<Args, ExecutionContext<Tx> | null>,
  ): (request: Request, ...args: Args) => Promise<Response> {
    const {
      handler,
      options: routeOptions,
      route,
    } = routeArguments<FetchRouteOptions, FetchIdempotentHandler<Args, ExecutionContext<Tx> | null>>(
      optionsOrHandler,
      maybeHandler,
    )
    if (routeOptions?.route !== undefined) {
      nonEmptyString('route', routeOptions.route, {
        of: '`idempotent()`',
        hint: 'It is the route template, such as /v1/orders/:id.',
      })
    }
    const limit = route.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES

    return async function idempotentHandler(request: Request, ...args: Args): Promise<Response> {
      const method = request.method.toUpperCase()
      const where = () => `${method} ${routeOptions?.route ?? new URL(request.url).pathname}`
      if (isSafeMethod(method)) return toResponse(policy.safeMethod(method, where(), log))
      const header = (name: string) => request.headers.get(name)
      const early = earlyRefusal(header, limit)
      if (early) {
        const reader = request.body !== null && !request.bodyUsed ? request.body.getReader() : undefined
        return refusalResponse(early, reader && (() => reader.read()))
      }
      let read: BodyResult | TooLarge
      if (request.bodyUsed) {
        const cached = await cachedBody(request, args)
        if (cached === undefined) {
          return toResponse(
            policy.bodyConsumed(
              where(),
              `Do not read it off the Request in middleware; the handler gets it parsed as \`body\`. On Hono, read it through c.req (validator('json'), c.req.json(), c.req.arrayBuffer()), which caches it, and pass the context on: \`(c) => handler(c.req.raw, c)\`.`,
              log,
            ),
          )
        }
        const size = 'bytes' in cached ? cached.bytes.byteLength : Buffer.byteLength(cached.text)
        if (size > limit) return toResponse(problemAnswer(payloadTooLarge()))
        read = 'bytes' in cached ? parseBody(cached.bytes, header) : parseBodyText(cached.text, header)
      } else {
        read = await readBody(request.body?.getReader(), limit, header)
      }
      if (!read.ok) {
        return 'tooLarge' in read
          ? refusalResponse(problemAnswer(payloadTooLarge()), read.rest)
          : toResponse(problemAnswer(read.problem))
      }
      const { body } = read
      let url: URL | undefined
      const urlOf = () => {
        url ??= new URL(request.url)
        return url
      }

      // As Hono's router matches it, so that every spelling of one path is one operation and one fingerprint.
      const path = decodePath(urlOf().pathname)
      let own: Response | undefined
      let ownBody: Uint8Array<ArrayBuffer> | undefined
      const verdict = await core.handle(route, {
        method,
        route: routeOptions?.route ?? path,
        path,
        header,
        body,
        query: () => queryOf(urlOf().searchParams),
        tenant: () => tenant(request, ...args),
        log,
        run: async (ctx): Promise<HandlerResponse> => {
          own = await handler(request, { body, idempotency: ctx }, ...args)
          if (!(own instanceof Response)) {
            throw new TypeError(`Expected the idempotent() handler to return a Response, got ${String(own)}.`)
          }
          ownBody = new Uint8Array(await own.arrayBuffer())
          const headers: Record<string, string> = {}
          own.headers.forEach((value, name) => {
            headers[name] = value
          })
          return { status: own.status, headers, body: ownBody }
        },
      })
      if (verdict === PASS) return handler(request, { body, idempotency: null }, ...args)
      if (!verdict.own) return toResponse(verdict)
      const response = own as Response
      return new Response(NULL_BODY_STATUSES.has(response.status) ? null : ownBody, {
        status: response.status,
        statusText: response.statusText,
        headers: response.headers,
      })
    }
  }
  return idempotent as FetchIdempotent<Args, Tx>
}

export type { AdapterLogger, FingerprintOptions, IdempotencyRouteOptions } from '../http/options.js'
