import type {
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  onRequestHookHandler,
  onSendHookHandler,
  preParsingHookHandler,
  RouteHandlerMethod,
} from 'fastify'
import fp from 'fastify-plugin'
import type { ExecutionContext } from '../engine/types.js'
import { isStoreSetupError } from '../errors.js'
import {
  type Answer,
  headerStrings,
  misconfiguredAnswer,
  problemAnswer,
  type ResponseTarget,
  resetHandlerHeaders,
  writeReplacement,
} from '../http/answer.js'
import { createHttpCore, HeldResponse } from '../http/core.js'
import { checkAdapterOptions, type ResolvedRoute, resolveRoute } from '../http/options.js'
import { DEFAULT_MAX_BODY_BYTES, headerProblem } from '../http/request.js'
import { payloadBytes } from './capture.js'
import type { IdempotencyPluginOptions } from './config.js'
import { frameworkProblem, installStrictJsonParser } from './json.js'

const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS'])
const ADAPTER = '@oncely/server/fastify'
/** Marks a route's config as set up by the plugin, holding its resolved options. */
const kRoute = Symbol('oncely.route')
const kHeld = Symbol('oncely.held')
type Held = FastifyRequest & { [kHeld]?: HeldResponse }
type MarkedConfig = { idempotency?: unknown; [kRoute]?: ResolvedRoute }

const configOf = (request: FastifyRequest) => request.routeOptions.config as MarkedConfig | undefined

const appendHook = <T>(existing: T | T[] | undefined, hook: T): T[] =>
  existing === undefined ? [hook] : Array.isArray(existing) ? [...existing, hook] : [existing, hook]

const target = (reply: FastifyReply): ResponseTarget => ({
  status: (code) => reply.code(code),
  setHeader: (name, value) => reply.header(name, value),
  removeHeader: (name) => reply.removeHeader(name),
})

/** Sends an answer that replaces the handler's response (the handler did not run, or threw). */
const sendAnswer = (reply: FastifyReply, answer: Answer): FastifyReply =>
  answer.own ? reply : reply.send(writeReplacement(target(reply), answer))

async function plugin(fastify: FastifyInstance, options: IdempotencyPluginOptions): Promise<void> {
  checkAdapterOptions(options, ADAPTER)
  const { engine, tenant } = options
  const core = createHttpCore(engine, ADAPTER)

  installStrictJsonParser(fastify, (request) => Boolean(configOf(request)?.[kRoute]))
  fastify.decorateRequest('idempotency', null)

  // A missing migration fails start-up with the table and the fix; a database that cannot be reached yet does not
  // (it may come up later, and requests get 503 meanwhile), but is logged.
  fastify.addHook('onReady', async () => {
    try {
      await engine.verify()
    } catch (error) {
      if (isStoreSetupError(error)) throw error
      fastify.log.error({ err: error }, `oncely: could not check the idempotency store at start-up`)
    }
  })

  // A route registered before this plugin (or next to it without awaiting `register`) never passed through the
  // onRoute hook below, so it would run without a key check. Refuse its requests, loudly, rather than that.
  const reported = new Set<string>()
  const refuseUnprepared: onRequestHookHandler = (request, reply, done) => {
    const config = configOf(request)
    if (!config?.idempotency || config[kRoute] || SAFE_METHODS.has(request.method)) return done()
    const route = `${request.method} ${request.routeOptions.url}`
    if (!reported.has(route)) {
      reported.add(route)
      request.log.error(
        `oncely: route ${route} has config.idempotency but was registered before the idempotency plugin, so it cannot be made idempotent. Register the plugin first: \`await app.register(idempotency, { engine, tenant })\`, then the routes.`,
      )
    }
    sendAnswer(reply, misconfiguredAnswer('This route is not set up correctly.'))
  }
  fastify.addHook('onRequest', refuseUnprepared)

  const holdResponse: onSendHookHandler = async (request, reply, payload) => {
    const held = (request as Held)[kHeld]
    if (!held?.capturing) return payload
    held.capturing = false
    const body = await payloadBytes(payload)
    held.captured.resolve({ status: reply.statusCode, headers: headerStrings(reply.getHeaders()), body })
    let answer: Answer
    try {
      answer = await held.decision.promise
    } catch (error) {
      // The error page that replaces the response must not carry its Location, ETag, ...
      resetHandlerHeaders(target(reply))
      throw error
    }
    return answer.own ? body : writeReplacement(target(reply), answer)
  }

  fastify.addHook('onRoute', (routeOptions) => {
    const raw = routeOptions.config?.idempotency
    if (!raw) return
    const methods = (Array.isArray(routeOptions.method) ? routeOptions.method : [routeOptions.method]).map(
      (method) => method.toUpperCase(),
    )
    const template = routeOptions.url
    const where = `${methods.join(',')} ${template}`
    const safe = methods.filter((method) => SAFE_METHODS.has(method))
    if (safe.length > 0) {
      throw new TypeError(
        `Expected \`config.idempotency\` only on POST, PUT, PATCH or DELETE routes, but route \`${where}\` answers ${safe.join(', ')}: safe methods are never idempotency-checked. Remove the config, or split the route.`,
      )
    }
    const route = resolveRoute(raw, (option) =>
      option
        ? `config.idempotency.${option}\` of route \`${where}`
        : `config.idempotency\` of route \`${where}`,
    )
    routeOptions.config = { ...routeOptions.config, [kRoute]: route } as typeof routeOptions.config
    if (route.maxBodyBytes !== undefined) routeOptions.bodyLimit = route.maxBodyBytes
    const bodyLimit = routeOptions.bodyLimit ?? fastify.initialConfig.bodyLimit ?? DEFAULT_MAX_BODY_BYTES
    const rejectEarly: preParsingHookHandler = async (request, reply, payload) => {
      const details = headerProblem((name) => request.headers[name], bodyLimit)
      // Answered before the body is read; nothing is reserved.
      if (details) await sendAnswer(reply, problemAnswer(details))
      return payload
    }
    routeOptions.preParsing = appendHook(routeOptions.preParsing, rejectEarly)
    routeOptions.onSend = appendHook(routeOptions.onSend, holdResponse)

    const userErrorHandler = routeOptions.errorHandler
    routeOptions.errorHandler = function (error, request, reply) {
      const details = frameworkProblem(error)
      if (details) return sendAnswer(reply, problemAnswer(details))
      if (userErrorHandler) return userErrorHandler.call(this, error, request, reply)
      // Rethrowing hands the error to the enclosing error handler, as if this route had none.
      throw error
    }

    const original = routeOptions.handler as RouteHandlerMethod
    routeOptions.handler = async function idempotentHandler(this: FastifyInstance, request, reply) {
      const held = new HeldResponse()
      const verdict = await held.settle(
        core.handle(route, {
          method: request.method,
          route: template,
          header: (name) => request.headers[name],
          body: request.body,
          query: () => request.query as Record<string, unknown>,
          tenant: () => tenant(request),
          log: request.log,
          run: (ctx) => {
            ;(request as { idempotency: ExecutionContext | null }).idempotency = ctx
            ;(request as Held)[kHeld] = held
            const send = reply.send
            reply.send = function (payload?: unknown) {
              held.sent = true
              reply.send = send
              return send.call(this, payload)
            }
            return held.run(
              () => original.call(this, request, reply),
              (value) => {
                if (value !== undefined && value !== reply) reply.send(value)
              },
            )
          },
        }),
      )
      if (verdict === undefined) return reply
      if (verdict.pass) return original.call(this, request, reply)
      return sendAnswer(reply, verdict)
    }
  })
}

/**
 * The Fastify adapter. Register it before your routes; then mark POST, PUT, PATCH and DELETE routes with
 * `config: { idempotency: true }` or `config: { idempotency: { ...options } }`. The store is checked when the
 * server starts: without its table, `app.ready()` and `app.listen()` reject with a `StoreSetupError` naming the fix.
 *
 * @example
 * await app.register(idempotency, { engine, tenant: (request) => request.user.accountId })
 * app.post('/v1/payments', { config: { idempotency: true } }, async (request, reply) => {
 *   const { tx } = request.idempotency
 *   const { rows } = await tx.query('INSERT INTO payments (amount) VALUES ($1) RETURNING id', [100])
 *   return reply.code(201).send({ id: rows[0].id })
 * })
 */
export const idempotency = fp(plugin, { fastify: '5.x', name: '@oncely/server' })
