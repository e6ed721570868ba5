import { JsonSyntaxError, type ProblemDetails, parseStrictJson, problem } from '@oncely/protocol'
import type { FastifyInstance, FastifyRequest } from 'fastify'

/** The error the strict parser reports; the route error handler turns it into an `invalid_json` problem. */
class InvalidJsonError extends Error {
  override name = 'InvalidJsonError' as const
  readonly statusCode = 400
  readonly code = 'ONCELY_INVALID_JSON'
}

const isIdempotentRoute = (request: FastifyRequest) => Boolean(request.routeOptions.config?.idempotency)

/**
 * Replaces the JSON parser of the context the plugin is registered in: idempotent routes parse strictly (duplicate
 * member names and integers beyond 2^53 are 400, because either makes two different requests fingerprint alike);
 * every other route keeps Fastify's own parser.
 */
export function installStrictJsonParser(fastify: FastifyInstance): void {
  const fallback = fastify.getDefaultJsonParser('error', 'error')
  fastify.addContentTypeParser('application/json', { parseAs: 'string' }, (request, body, done) => {
    if (!isIdempotentRoute(request)) return fallback(request, body as string, done)
    try {
      done(null, parseStrictJson(body as string))
    } catch (error) {
      const message = error instanceof JsonSyntaxError ? error.message : 'The body is not valid JSON.'
      done(new InvalidJsonError(message), undefined)
    }
  })
}

/** Maps the errors Fastify raises before the handler (body too large, bad content type, bad JSON) to problems. */
export function frameworkProblem(error: { code?: unknown; message?: string }): ProblemDetails | undefined {
  switch (error.code) {
    case 'ONCELY_INVALID_JSON':
      return problem('invalid_json', error.message)
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return problem('invalid_json', 'The body is empty; send a JSON value.')
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return problem('payload_too_large', 'The request body exceeds the limit of this route.')
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return problem('unsupported_media_type', 'Send the body as application/json.')
    default:
      return undefined
  }
}

/** True when the request carries a body whose content type is not JSON (checked before parsing, so before any reservation). */
export function hasNonJsonBody(request: FastifyRequest): boolean {
  const length = request.headers['content-length']
  const hasBody =
    request.headers['transfer-encoding'] !== undefined || (length !== undefined && length !== '0')
  if (!hasBody) return false
  const type = (request.headers['content-type'] ?? '').split(';')[0]?.trim().toLowerCase()
  return type !== 'application/json'
}
