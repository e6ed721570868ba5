import type { ProblemDetails } from '@oncely/protocol'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import { parseBody, payloadTooLarge, unsupportedMediaType } from '../http/request.js'

/** The error the strict parser reports; the route error handler turns its problem into the answer. */
class InvalidJsonError extends Error {
  override name = 'InvalidJsonError' as const
  readonly statusCode = 400
  readonly code = 'ONCELY_INVALID_JSON'
  constructor(readonly problem: ProblemDetails) {
    super(problem.detail)
  }
}

/** A request refused from its headers alone (413, 415), thrown from preParsing so the route error handler answers it. */
export class RequestRefusedError extends Error {
  override name = 'RequestRefusedError' as const
  readonly code = 'ONCELY_REQUEST_REFUSED'
  readonly statusCode: number
  constructor(readonly problem: ProblemDetails) {
    super(problem.detail)
    this.statusCode = problem.status
  }
}

/**
 * Replaces the JSON parser of the context the plugin is registered in: idempotent routes parse strictly (see
 * `parseBody`); every other route keeps Fastify's own parser. `isIdempotent` may throw to refuse the request.
 */
export function installStrictJsonParser(
  fastify: FastifyInstance,
  isIdempotent: (request: FastifyRequest) => boolean,
): void {
  const fallback = fastify.getDefaultJsonParser('error', 'error')
  // As bytes, so that `parseBody` decodes them strictly (Fastify's string decoding is lenient). Fastify's own parser
  // takes a Buffer as well as a string, though it is typed for strings.
  fastify.addContentTypeParser('application/json', { parseAs: 'buffer' }, (request, body, done) => {
    let strict: boolean
    try {
      strict = isIdempotent(request)
    } catch (error) {
      return done(error as Error, undefined)
    }
    if (!strict) return fallback(request, body as unknown as string, done)
    const parsed = parseBody(body as Buffer, (name) => request.headers[name])
    if (parsed.ok) done(null, parsed.body)
    else done(new InvalidJsonError(parsed.problem), undefined)
  })
}

/** Maps the errors Fastify raises before the handler (body too large, bad content type, bad JSON) to problems. */
export function frameworkProblem(error: { code?: unknown; problem?: unknown }): ProblemDetails | undefined {
  switch (error.code) {
    case 'ONCELY_INVALID_JSON':
    case 'ONCELY_REQUEST_REFUSED':
      return error.problem as ProblemDetails
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return payloadTooLarge()
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return unsupportedMediaType()
    default:
      return undefined
  }
}
