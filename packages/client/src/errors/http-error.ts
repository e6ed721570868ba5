import type { ProblemDetails } from '@oncely/protocol'
import { hasName, OncelyError } from './oncely-error.js'

/**
 * The server answered with a status the client does not treat as success. Thrown directly for a non-retried 4xx
 * (the intent is settled as failed); collected into {@link RetryExhaustedError} for retried statuses.
 */
export class HTTPError extends OncelyError {
  override name: 'HTTPError' | 'IdempotencyKeyReusedError' = 'HTTPError'
  /** The HTTP status code. */
  readonly status: number
  /** The parsed RFC 9457 problem details, when the body was `application/problem+json` (or JSON with a status). */
  readonly problem: ProblemDetails | undefined
  /** The response headers. */
  readonly headers: Headers
  /** The parsed response body (JSON when it was JSON, else text; `undefined` when empty). */
  readonly data: unknown

  constructor(
    status: number,
    init: { problem?: ProblemDetails | undefined; headers: Headers; data: unknown; message?: string },
  ) {
    const detail = init.problem?.detail ?? init.problem?.title
    super(init.message ?? `Request failed with status ${status}${detail ? `: ${detail}` : ''}`)
    this.status = status
    this.problem = init.problem
    this.headers = init.headers
    this.data = init.data
  }
}

/** True when `error` is an {@link HTTPError} (or a subclass), also across realms. */
export function isHTTPError(error: unknown): error is HTTPError {
  return error instanceof HTTPError || hasName(error, HTTP_ERROR_NAMES)
}

const HTTP_ERROR_NAMES = new Set(['HTTPError', 'IdempotencyKeyReusedError'])
