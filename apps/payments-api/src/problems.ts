/**
 * The demo's own RFC 9457 problems (oncely's protocol errors come from @oncely/protocol and the server adapter).
 */
import { STATUS_CODES } from 'node:http'
import type { Socket } from 'node:net'
import { PROBLEM_CONTENT_TYPE, type ProblemDetails } from '@oncely/protocol'
import type { HandlerResponse } from '@oncely/server'
import type { FastifyInstance, FastifyReply } from 'fastify'
import { CardDeclinedError, ProviderKeyReusedError } from './provider.js'

/** The demo's error codes, with their status and title. */
export const DEMO_PROBLEMS = {
  unauthorized: { status: 401, title: 'Missing or malformed credentials' },
  invalid_request: { status: 400, title: 'Request body is invalid' },
  payment_declined: { status: 402, title: 'The payment was declined' },
  card_declined: { status: 402, title: 'The card was declined' },
  provider_key_reused: { status: 422, title: 'The payment provider refused a reused key' },
  not_found: { status: 404, title: 'Not found' },
  provider_unavailable: { status: 503, title: 'The payment provider is temporarily unavailable' },
  starting: { status: 503, title: 'The service is starting' },
} as const satisfies Record<string, { status: number; title: string }>

/** One of {@link DEMO_PROBLEMS}. */
export type DemoProblemCode = keyof typeof DEMO_PROBLEMS

/** Builds the problem details for a demo error. */
export function demoProblem(
  code: DemoProblemCode,
  detail: string,
  extensions: Record<string, unknown> = {},
): ProblemDetails {
  const { status, title } = DEMO_PROBLEMS[code]
  return { type: `urn:oncely:demo:problem:${code}`, title, status, detail, code, ...extensions }
}

/**
 * The problem a thrown business error stands for (a refused card, a provider key reused for another payment), or
 * undefined for any other error.
 */
export function problemOfError(error: unknown): ProblemDetails | undefined {
  if (error instanceof CardDeclinedError) return demoProblem('card_declined', error.message)
  // The charge's provider key derives from the idempotency key: this key already paid for another amount or
  // currency, before it expired here. The provider's own message names its key, which is not the client's business.
  if (error instanceof ProviderKeyReusedError) {
    return demoProblem(
      'provider_key_reused',
      'This idempotency key was used for a payment of another amount or currency; send a new payment with a new key.',
    )
  }
  return undefined
}

/**
 * The route's `renderError`: the response the engine stores for a thrown permanent error, the same problem+json
 * the error handler would send.
 */
export function renderProblem(error: unknown): HandlerResponse {
  const details = problemOfError(error) ?? {
    type: 'about:blank',
    title: 'Bad request',
    status: 400,
    detail: error instanceof Error ? error.message : String(error),
  }
  return { status: details.status, headers: { 'content-type': PROBLEM_CONTENT_TYPE }, body: details }
}

/** Sends problem details with their status and `application/problem+json`. */
export function sendProblem(reply: FastifyReply, details: ProblemDetails): FastifyReply {
  return reply.code(details.status).type(PROBLEM_CONTENT_TYPE).send(details)
}

interface FastifyLikeError {
  statusCode?: number
  code?: string
  message: string
  validation?: { instancePath: string; message?: string }[]
}

/**
 * Answers every error as problem+json: schema failures as 400 `invalid_request` listing what is wrong, Fastify's
 * own 4xx errors (bad JSON, wrong content type, body too large) with their status, a route that does not exist as
 * 404 `not_found`, anything else as a 500 that says nothing about internals.
 */
export function registerErrorHandler(app: FastifyInstance): void {
  // Fastify's own 404 is application/json with other members; a client reads every error here one way.
  app.setNotFoundHandler((request, reply) =>
    sendProblem(reply, demoProblem('not_found', `No ${request.method} route at this path.`)),
  )
  app.setErrorHandler((error: FastifyLikeError, request, reply) => {
    if (error.validation) {
      const errors = error.validation.map((issue) => ({
        pointer: `#${issue.instancePath}`,
        detail: issue.message ?? 'is invalid',
      }))
      const detail = errors
        .map((e) => `${e.pointer === '#' ? 'body' : e.pointer.slice(2)} ${e.detail}`)
        .join('; ')
      return sendProblem(reply, demoProblem('invalid_request', detail, { errors }))
    }
    const business = problemOfError(error)
    if (business) return sendProblem(reply, business)
    const status = error.statusCode ?? 500
    if (status >= 400 && status < 500) return sendProblem(reply, frameworkProblem(error, status))
    request.log.error({ err: error }, 'request failed')
    return sendProblem(reply, { type: 'about:blank', title: 'Internal Server Error', status: 500 })
  })
}

/** One of Fastify's own 4xx errors, with its code as the title. */
function frameworkProblem(error: FastifyLikeError, status: number): ProblemDetails {
  return { type: 'about:blank', title: error.code ?? 'Bad request', status, detail: error.message }
}

/**
 * Fastify's `frameworkErrors` option: the errors it raises before routing (a URL it cannot decode), which the error
 * handler never sees, answered as problem+json too.
 */
export const frameworkErrors = (error: FastifyLikeError, _request: unknown, reply: FastifyReply): void => {
  sendProblem(reply, frameworkProblem(error, error.statusCode ?? 400))
}

/**
 * Fastify's `clientErrorHandler` option: a message Node cannot parse as HTTP (a control character in a header, an
 * unknown method, headers over 16 KiB) never reaches a route, so it is answered on the socket, as problem+json too.
 */
export function clientErrorHandler(error: Error & { code?: string }, socket: Socket): void {
  // A reset connection has no one left to answer.
  if (error.code === 'ECONNRESET' || socket.destroyed) return
  const status =
    error.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? 408 : error.code === 'HPE_HEADER_OVERFLOW' ? 431 : 400
  const title = STATUS_CODES[status] ?? 'Bad Request'
  const body = JSON.stringify({
    type: 'about:blank',
    title,
    status,
    detail: 'The request is not a valid HTTP/1.1 message.',
  } satisfies ProblemDetails)
  if (socket.writable) {
    socket.write(
      `HTTP/1.1 ${status} ${title}\r\nContent-Length: ${Buffer.byteLength(body)}\r\nContent-Type: ${PROBLEM_CONTENT_TYPE}\r\nConnection: close\r\n\r\n${body}`,
    )
  }
  socket.destroy(error)
}
