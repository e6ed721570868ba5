import { createHash } from 'node:crypto'
import { type FingerprintInput, fingerprintMaterial, parseIdempotencyKey, problem } from '@oncely/protocol'
import type {
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  onSendHookHandler,
  preParsingHookHandler,
  RouteHandlerMethod,
} from 'fastify'
import fp from 'fastify-plugin'
import type { Engine, ExecuteInput, Outcome } from '../engine/types.js'
import { isResponseTooLargeError } from '../errors.js'
import { headerStrings, payloadBytes, ReplyCapture } from './capture.js'
import { type IdempotencyPluginOptions, type ResolvedRouteConfig, resolveRouteConfig } from './config.js'
import { frameworkProblem, hasNonJsonBody, installStrictJsonParser } from './json.js'
import { problemPayload, sendProblem, storedPayload } from './reply.js'

const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS'])
const kCapture = Symbol('oncely.capture')
type CapturingRequest = FastifyRequest & { [kCapture]?: ReplyCapture }

const appendHook = <T>(existing: T | T[] | undefined, hook: T): T[] =>
  existing === undefined ? [hook] : Array.isArray(existing) ? [...existing, hook] : [existing, hook]

/** The protocol's `requestFingerprint`, hashed with node:crypto (the protocol's portable SHA-256 is pure JS). */
const requestFingerprint = (input: FingerprintInput) =>
  createHash('sha256').update(fingerprintMaterial(input)).digest('hex')

function fingerprintBody(body: unknown, route: ResolvedRouteConfig): unknown {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return body
  if (!route.include && route.exclude.size === 0) return body
  const picked: Record<string, unknown> = {}
  for (const [field, value] of Object.entries(body)) {
    if (route.include && !route.include.includes(field)) continue
    if (route.exclude.has(field)) continue
    picked[field] = value
  }
  return picked
}

/** What an outcome that replaces (or confirms) the handler's response looks like on the wire. */
function answer(reply: FastifyReply, outcome: Outcome, own: Buffer | undefined): Buffer | string {
  switch (outcome.kind) {
    case 'executed':
      return own ?? storedPayload(reply, outcome.response, false)
    case 'replayed':
      return storedPayload(reply, outcome.response, true)
    case 'in_progress':
      return problemPayload(
        reply,
        problem('request_in_progress', 'A request with this key is being processed; retry later.'),
        outcome.retryAfterMs,
      )
    case 'mismatch':
      return problemPayload(
        reply,
        problem('idempotency_key_reused', 'This key was already used with a different request.'),
      )
    case 'unavailable':
      return problemPayload(
        reply,
        problem('store_unavailable', 'The idempotency store is unavailable; retry later.'),
        outcome.retryAfterMs,
      )
    case 'retryable_failure':
      if (outcome.reason === 'response_too_large' && isResponseTooLargeError(outcome.error)) {
        return problemPayload(reply, problem('response_too_large', outcome.error.message))
      }
      if (outcome.response) return own ?? storedPayload(reply, outcome.response, false)
      throw outcome.error
  }
}

async function plugin(fastify: FastifyInstance, options: IdempotencyPluginOptions): Promise<void> {
  const engine: Engine = options?.engine
  if (typeof engine?.execute !== 'function')
    throw new TypeError('Expected `engine` to be an engine from createEngine().')
  if (typeof options.tenant !== 'function')
    throw new TypeError('Expected `tenant` to be a function of the request.')
  const { tenant } = options

  installStrictJsonParser(fastify)
  fastify.decorateRequest('idempotency', null as never)

  const rejectNonJson: preParsingHookHandler = async (request, reply, payload) => {
    if (!SAFE_METHODS.has(request.method) && hasNonJsonBody(request)) {
      // Reply before the body is read; nothing is reserved.
      await sendProblem(reply, problem('unsupported_media_type', 'Send the body as application/json.'))
    }
    return payload
  }

  const onSend: onSendHookHandler = async (request, reply, payload) => {
    const capture = (request as CapturingRequest)[kCapture]
    if (!capture?.capturing) return payload
    capture.capturing = false
    const body = await payloadBytes(payload)
    capture.captured.resolve({ status: reply.statusCode, headers: headerStrings(reply.getHeaders()), body })
    return answer(reply, await capture.decision.promise, body)
  }

  fastify.addHook('onRoute', (routeOptions) => {
    const raw = routeOptions.config?.idempotency
    if (!raw) return
    const methods = Array.isArray(routeOptions.method) ? routeOptions.method : [routeOptions.method]
    if (methods.every((method) => SAFE_METHODS.has(method.toUpperCase()))) return
    const template = routeOptions.url
    const route = resolveRouteConfig(raw, `${methods.join(',')} ${template}`)
    if (route.maxBodyBytes !== undefined) routeOptions.bodyLimit = route.maxBodyBytes
    routeOptions.preParsing = appendHook(routeOptions.preParsing, rejectNonJson)
    routeOptions.onSend = appendHook(routeOptions.onSend, onSend)

    const userErrorHandler = routeOptions.errorHandler
    routeOptions.errorHandler = function (error, request, reply) {
      const details = frameworkProblem(error)
      if (details) return sendProblem(reply, details)
      if (userErrorHandler) return userErrorHandler.call(this, error, request, reply)
      // Rethrowing hands the error to the enclosing error handler, as if this route had none.
      throw error
    }

    const original = routeOptions.handler as RouteHandlerMethod
    routeOptions.handler = async function idempotentHandler(this: FastifyInstance, request, reply) {
      if (SAFE_METHODS.has(request.method)) return original.call(this, request, reply)
      const parsed = parseIdempotencyKey(request.headers['idempotency-key'])
      if (!parsed.ok) {
        if (parsed.code === 'idempotency_key_missing' && !route.required)
          return original.call(this, request, reply)
        request.log.info({ idempotencyKeyError: parsed.code }, 'oncely: rejected idempotency key')
        return sendProblem(reply, problem(parsed.code, parsed.detail))
      }
      const key = parsed.key
      const scope = await tenant(request)
      if (typeof scope !== 'string' || scope === '') {
        throw new TypeError('The `tenant` function of @oncely/server/fastify must return a non-empty string.')
      }
      const operation = route.operation ?? `${request.method} ${template}`
      const fingerprint = requestFingerprint({
        method: request.method,
        route: template,
        body: fingerprintBody(request.body, route),
        query: route.query ? (request.query as Record<string, unknown>) : undefined,
      })
      const requestHeaders: Record<string, string> = {}
      for (const name of route.requestHeaders) {
        const value = request.headers[name]
        if (value !== undefined) requestHeaders[name] = Array.isArray(value) ? value.join(', ') : value
      }

      const capture = new ReplyCapture()
      ;(request as CapturingRequest)[kCapture] = capture
      const input: ExecuteInput = {
        scope,
        operation,
        key,
        fingerprint,
        handler: async (ctx) => {
          request.idempotency = ctx
          capture.capturing = true
          const send = reply.send
          reply.send = function (payload?: unknown) {
            capture.sent = true
            reply.send = send
            return send.call(this, payload)
          }
          // A handler that returns `reply` resolves only once the response is written, which waits for this
          // commit; so race it against the capture instead of awaiting it.
          const done = Promise.resolve(original.call(this, request, reply)).then((value) => ({ value }))
          done.catch(() => {})
          const first = await Promise.race([done, capture.captured.promise])
          if ('value' in first) {
            const { value } = first
            if (!capture.sent && value !== undefined && value !== reply) reply.send(value)
            return capture.captured.promise
          }
          return first
        },
        ...(route.requestHeaders.length > 0 ? { requestHeaders } : {}),
        ...(route.classify ? { classify: route.classify } : {}),
        ...(route.wait ? { wait: route.wait } : {}),
        ...(route.failOpen ? { failOpen: true } : {}),
        ...(route.leaseMs ? { leaseMs: route.leaseMs } : {}),
        ...(route.retentionMs ? { retentionMs: route.retentionMs } : {}),
      }

      let outcome: Outcome
      try {
        outcome = await engine.execute(input)
      } catch (error) {
        // A hook simulated a crash, or the handler's response could not be normalized.
        capture.decision.reject(error)
        capture.capturing = false
        if (capture.sent) return reply
        throw error
      }
      request.log.info(
        { idempotencyKey: key, scope, operation, outcome: outcome.kind },
        'oncely: request settled',
      )
      if (capture.sent) {
        capture.decision.resolve(outcome)
        return reply
      }
      capture.capturing = false
      return reply.send(answer(reply, outcome, undefined))
    }
  })
}

/**
 * The Fastify adapter. Register it before your routes; then mark routes with `config: { idempotency: {...} }`.
 *
 * @example
 * await app.register(idempotency, { engine, tenant: (request) => request.user.accountId })
 * app.post('/v1/payments', { config: { idempotency: { required: true } } }, async (request, reply) => {
 *   const { tx } = request.idempotency
 *   const { rows } = await tx.query('INSERT INTO payments (amount) VALUES ($1) RETURNING id', [request.body.amount])
 *   return reply.code(201).header('location', `/v1/payments/${rows[0].id}`).send({ id: rows[0].id })
 * })
 */
export const idempotency = fp(plugin, { fastify: '5.x', name: '@oncely/server' })
