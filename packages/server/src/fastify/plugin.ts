import type {
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  preParsingHookHandler,
  RouteHandlerMethod,
  RouteOptions,
} from 'fastify'
import fp from 'fastify-plugin'
import type { HandlerResponse } from '../engine/types.js'
import { isStoreSetupError } from '../errors.js'
import {
  type Answer,
  problemAnswer,
  type ReplacingAnswer,
  type ResponseWriter,
  replyWriter,
  writeReplacement,
} from '../http/answer.js'
import { createHttpCore, type Exchange, type HttpCore, PASS, type Verdict } from '../http/core.js'
import { HeldResponse } from '../http/held.js'
import { nodeChunks } from '../http/node.js'
import { checkAdapterOptions, type ResolvedRoute, resolveRoute } from '../http/options.js'
import { checkRouteMethods } from '../http/policy.js'
import { refuse } from '../http/refusal.js'
import {
  DEFAULT_MAX_BODY_BYTES,
  decodePath,
  headerProblem,
  isSafeMethod,
  targetPath,
} from '../http/request.js'
import { payloadBytes } from './capture.js'
import type { FastifyIdempotencyContext, FastifyIdempotencyOptions, RegisteredTx } from './config.js'
import { frameworkProblem, installStrictJsonParser, RequestRefusedError } from './json.js'

const ADAPTER = '@oncely/server/fastify'
/** Marks a route's config as set up by the plugin, holding its resolved options. */
const kRoute = Symbol('oncely.route')
const kHeld = Symbol('oncely.held')
type Held = FastifyRequest & { [kHeld]?: HeldResponse<FastifyReply> }
type MarkedConfig = { idempotency?: unknown; [kRoute]?: ResolvedRoute }

/** A request to a route that asks for idempotency but was registered before the plugin. */
class UnpreparedRouteError extends Error {
  override name = 'UnpreparedRouteError' as const
  readonly statusCode = 500
  readonly code = 'ONCELY_UNPREPARED_ROUTE'
  constructor(readonly route: string) {
    // What the client sees; the log has the route and the fix.
    super('This route is not set up correctly.')
  }
}

const appendHook = <T>(existing: T | T[] | undefined, hook: T): T[] =>
  existing === undefined ? [hook] : Array.isArray(existing) ? [...existing, hook] : [existing, hook]

const writer = replyWriter as ResponseWriter<FastifyReply>

/** Sends an answer that replaces the handler's response (the handler did not run, or threw). */
const sendAnswer = (reply: FastifyReply, answer: Answer, held?: HeldResponse<FastifyReply>): FastifyReply =>
  answer.own
    ? reply
    : reply.send(held ? held.replace(answer) : writeReplacement(writer, reply, answer, undefined))

/**
 * Answers a request refused before its body was read to its end (over the limit, not JSON): the answer goes out at
 * once and the connection closes once the rest of the body was discarded (see `refuse`).
 */
function sendRefusal(request: FastifyRequest, reply: FastifyReply, answer: ReplacingAnswer): FastifyReply {
  const refusal = refuse(answer, nodeChunks(request.raw))
  writeReplacement(writer, reply, { ...answer, headers: refusal.headers }, undefined)
  return reply.send(refusal.body)
}

/**
 * The onSend hook of an idempotent route: hands the handler's response to its hold, sends what the engine decided.
 * Callback-style rather than async: the answer goes on down the hook chain within the engine's settle, so the response
 * is written before the route's handler returns `reply` (a reply returned unsent makes Fastify wait for its end with
 * stream listeners), and the common response costs no promise.
 */
function holdResponse(
  request: FastifyRequest,
  reply: FastifyReply,
  payload: unknown,
  done: (error: Error | null, payload?: unknown) => void,
): void {
  const held = (request as Held)[kHeld]
  if (!held?.capturing) {
    done(null, payload)
    return
  }
  const bytes = payloadBytes(payload)
  const response = (body: Buffer): HandlerResponse => ({
    status: reply.statusCode,
    // The headers as set (lower-case names): the engine serialises the ones it stores, once.
    headers: reply.getHeaders(),
    body,
  })
  held.capture(bytes instanceof Promise ? bytes.then(response) : response(bytes), {
    release: (answer) => continueSend(reply, done, answer.own ? bytes : held.replace(answer)),
    fail: (error) => {
      // The error page that replaces the response must not carry its Location, Set-Cookie, ...
      held.undo()
      done(error as Error)
    },
  })
}

/** Hands the payload to the rest of the onSend chain: a stream's bytes once read, anything else at once. */
function continueSend(
  reply: FastifyReply,
  done: (error: Error | null, payload?: unknown) => void,
  payload: Buffer | Promise<Buffer>,
): void {
  if (payload instanceof Promise) {
    payload.then(
      (bytes) => done(null, bytes),
      (error: Error) => done(error),
    )
    return
  }
  try {
    done(null, payload)
  } catch (error) {
    // The rest of the chain threw once the engine had decided: nothing is left to undo, and this response is lost.
    reply.log.error({ err: error }, 'oncely: sending the committed response failed')
  }
}

type ErrorHandler = NonNullable<RouteOptions['errorHandler']>

/** The route's error handler: the problems of what Fastify refused before the handler, else the route's own. */
function refusingErrors(userErrorHandler: ErrorHandler | undefined): ErrorHandler {
  return function (this: FastifyInstance, error, request, reply) {
    const details = frameworkProblem(error)
    if (details && !request.raw.readableEnded) return sendRefusal(request, reply, problemAnswer(details))
    if (details) return sendAnswer(reply, problemAnswer(details))
    if (userErrorHandler) return userErrorHandler.call(this, error, request, reply)
    // Rethrowing hands the error to the enclosing error handler, as if this route had none.
    throw error
  } as ErrorHandler
}

async function verifyStore(
  fastify: FastifyInstance,
  engine: FastifyIdempotencyOptions['engine'],
): Promise<void> {
  try {
    await engine.verify()
  } catch (error) {
    if (isStoreSetupError(error)) throw error
    fastify.log.error({ err: error }, `oncely: could not check the idempotency store at start-up`)
  }
}

type Core = HttpCore<RegisteredTx>
type Tenant = FastifyIdempotencyOptions['tenant']

async function plugin(fastify: FastifyInstance, options: FastifyIdempotencyOptions): Promise<void> {
  checkAdapterOptions(options, ADAPTER)
  const { engine, tenant } = options
  const core = createHttpCore(engine, ADAPTER)

  // A route registered before this plugin (or next to a `register()` that was not awaited) never passed through the
  // onRoute hook below, so it would run without a key check. Its requests are refused, loudly, where the plugin
  // still sees them without a cost to any other route: in the JSON parser (which reads the route's config anyway)
  // and in `request.idempotency`.
  refuseUnpreparedRoutes(fastify)

  // Without its table, the server does not start: `app.ready()` and `app.listen()` reject naming the fix.
  fastify.addHook('onReady', () => verifyStore(fastify, engine))

  fastify.addHook('onRoute', (routeOptions) => prepareRoute(fastify, routeOptions, core, tenant))
}

/** Refuses the requests of a route that has `config.idempotency` but was registered before the plugin. */
function refuseUnpreparedRoutes(fastify: FastifyInstance): void {
  const reported = new Set<string>()
  const unprepared = (request: FastifyRequest): UnpreparedRouteError => {
    const route = `${request.method} ${request.routeOptions.url}`
    if (!reported.has(route)) {
      reported.add(route)
      request.log.error(
        `oncely: route ${route} has config.idempotency but was registered before the idempotency plugin, so it cannot be made idempotent. Register the plugin first: \`await app.register(fastifyIdempotency, { engine, tenant })\`, then the routes.`,
      )
    }
    return new UnpreparedRouteError(route)
  }
  installStrictJsonParser(fastify, (request) => {
    const config = request.routeOptions.config as MarkedConfig | undefined
    if (config?.[kRoute]) return true
    if (config?.idempotency && !isSafeMethod(request.method)) throw unprepared(request)
    return false
  })
  const kContext = Symbol('oncely.context')
  fastify.decorateRequest('idempotency', {
    getter(this: FastifyRequest & { [kContext]?: FastifyIdempotencyContext | null }) {
      const context = this[kContext]
      if (context !== undefined) return context
      const config = this.routeOptions.config as MarkedConfig | undefined
      if (config?.idempotency && !config[kRoute] && !isSafeMethod(this.method)) throw unprepared(this)
      return null
    },
    setter(
      this: FastifyRequest & { [kContext]?: FastifyIdempotencyContext | null },
      context: FastifyIdempotencyContext | null,
    ) {
      this[kContext] = context
    },
  })
}

/** The onRoute hook: makes a route with `config.idempotency` idempotent, its options checked at registration. */
function prepareRoute(
  fastify: FastifyInstance,
  routeOptions: RouteOptions,
  core: Core,
  tenant: Tenant,
): void {
  const raw = routeOptions.config?.idempotency
  if (!raw) return
  const methods = (Array.isArray(routeOptions.method) ? routeOptions.method : [routeOptions.method]).map(
    (method) => method.toUpperCase(),
  )
  const template = routeOptions.url
  const where = `${methods.join(',')} ${template}`
  checkRouteMethods(methods, where, 'config.idempotency')
  const route = resolveRoute(raw, { of: `route \`${where}\``, under: 'config.idempotency' })
  routeOptions.config = { ...routeOptions.config, [kRoute]: route } as typeof routeOptions.config
  if (route.maxBodyBytes !== undefined) routeOptions.bodyLimit = route.maxBodyBytes
  const bodyLimit = routeOptions.bodyLimit ?? fastify.initialConfig.bodyLimit ?? DEFAULT_MAX_BODY_BYTES
  routeOptions.preParsing = appendHook(routeOptions.preParsing, rejectEarly(bodyLimit))
  routeOptions.onSend = appendHook(routeOptions.onSend, holdResponse)

  routeOptions.errorHandler = refusingErrors(routeOptions.errorHandler)

  const original = routeOptions.handler as RouteHandlerMethod
  routeOptions.handler = idempotent(original, route, template, core, tenant)
}

/**
 * The preParsing hook of an idempotent route: refuses what its headers already tell is refused. Callback-style: an
 * async hook costs every request a promise.
 */
const rejectEarly =
  (bodyLimit: number): preParsingHookHandler =>
  (request, _reply, payload, done) => {
    const details = headerProblem((name) => request.headers[name], bodyLimit)
    // Answered by the route error handler before the body is read; nothing is reserved.
    if (details) done(new RequestRefusedError(details))
    else done(null, payload)
  }

/** The handler of an idempotent route: runs `original` through the engine and sends what the engine decided. */
function idempotent(
  original: RouteHandlerMethod,
  route: ResolvedRoute,
  template: string,
  core: Core,
  tenant: Tenant,
): RouteHandlerMethod {
  return async function idempotentHandler(this: FastifyInstance, request, reply) {
    const exchange = new FastifyExchange(this, request, reply, original, template, tenant)
    const { held } = exchange
    let verdict: Verdict | undefined
    try {
      verdict = await core.handle(route, exchange)
    } catch (error) {
      // The handler threw a retryable error (its writes rolled back): the error page carries none of its headers.
      held.undo()
      throw error
    } finally {
      // biome-ignore lint/suspicious/noThenProperty: Fastify's reply is a thenable; this puts its own then back.
      if (reply.then === settledAtOnce) reply.then = Object.getPrototypeOf(reply).then
    }
    if (verdict === undefined) return reply
    if (verdict === PASS) return original.call(this, request, reply)
    return sendAnswer(reply, verdict, held)
  }
}

/**
 * One request of an idempotent route as the HTTP core sees it (see `Exchange`): one object of one class, rather than
 * an object literal and a closure per function for every request.
 */
class FastifyExchange implements Exchange<RegisteredTx> {
  readonly method: string
  readonly path: string
  readonly body: unknown
  readonly log: FastifyRequest['log']
  readonly held: HeldResponse<FastifyReply>

  constructor(
    readonly instance: FastifyInstance,
    readonly request: FastifyRequest,
    readonly reply: FastifyReply,
    readonly original: RouteHandlerMethod,
    /** The route template, such as `/v1/orders/:id`. */
    readonly route: string,
    readonly tenantOf: Tenant,
  ) {
    this.method = request.method
    this.path = decodePath(targetPath(request.url))
    this.body = request.body
    this.log = request.log
    this.held = new HeldResponse(writer, reply)
  }

  header(name: string) {
    return this.request.headers[name]
  }

  query() {
    return this.request.query as Record<string, unknown>
  }

  tenant() {
    return this.tenantOf(this.request)
  }

  /** The engine's `run`: the route's handler with `request.idempotency` set, its response held until the commit. */
  run(ctx: FastifyIdempotencyContext): Promise<HandlerResponse> {
    const { request, reply, held } = this
    ;(request as { idempotency: FastifyIdempotencyContext | null }).idempotency = ctx
    ;(request as Held)[kHeld] = held
    // biome-ignore lint/suspicious/noThenProperty: see settledAtOnce; the reply stays a thenable, settled at once.
    reply.then = settledAtOnce
    const send = reply.send
    reply.send = function (payload?: unknown) {
      held.sending()
      reply.send = send
      return send.call(this, payload)
    }
    return held.run(this.#invoke, this.#returned)
  }

  readonly #invoke = (): unknown => this.original.call(this.instance, this.request, this.reply)

  /** A value the handler returned without sending (Fastify sends what an async handler returns). */
  readonly #returned = (value: unknown): void => {
    if (value !== undefined && value !== this.reply) this.reply.send(value)
  }
}

/**
 * `reply.then` while the plugin holds the route's response: settled at once. A handler that returns `reply` (as
 * Fastify's documentation shows) has its promise settled through `reply.then`, which waits for the response's end
 * with stream listeners unless it was sent; a held response is sent only after the commit, so every request paid for
 * those listeners. Nothing waits for the handler's promise once its response was handed over. The plugin's handler
 * puts Fastify's own back before it returns `reply` to Fastify, which may still have to wait for a streamed body.
 */
function settledAtOnce(this: FastifyReply, fulfilled?: () => void): void {
  fulfilled?.()
}

/**
 * The Fastify adapter. Register it before your routes; then mark POST, PUT, PATCH and DELETE routes with
 * `config: { idempotency: true }` or `config: { idempotency: { ...options } }`. The store is checked when the
 * server starts: without its table, `app.ready()` and `app.listen()` reject with a `StoreSetupError` naming the fix.
 * `request.idempotency.tx` is a `pg.PoolClient`, or the transaction type you name once in `Register` for an
 * engine over another datasource.
 *
 * @example
 * await app.register(fastifyIdempotency, { engine, tenant: (request) => request.user.accountId })
 * app.post('/v1/payments', { config: { idempotency: true } }, async (request, reply) => {
 *   const { tx } = request.idempotency
 *   const { rows } = await tx.query('INSERT INTO payments (amount) VALUES ($1) RETURNING id', [100])
 *   return reply.code(201).send({ id: rows[0].id })
 * })
 */
export const fastifyIdempotency = fp(plugin, { fastify: '5.x', name: '@oncely/server' })
