import type { ErrorClass, HandlerResponse } from './types.js'

function httpStatusOf(error: unknown): number | undefined {
  if (typeof error !== 'object' || error === null) return undefined
  const candidate = error as { statusCode?: unknown; status?: unknown }
  const status = candidate.statusCode ?? candidate.status
  return typeof status === 'number' && Number.isInteger(status) ? status : undefined
}

/**
 * 4xx statuses that say "not now" rather than "no": a request timeout (408), a conflict with the current state
 * (409), too early (425) and too many requests (429). A client retries them, so storing one would replay a refusal
 * that was meant to pass, for the whole retention, to every retry.
 */
const RETRYABLE_4XX: ReadonlySet<number> = new Set([408, 409, 425, 429])

/** True when a `headers` object (any case of names) carries a `Retry-After`. */
function hasRetryAfter(headers: unknown): boolean {
  if (typeof headers !== 'object' || headers === null) return false
  for (const name in headers) {
    if (name.length === 11 && name.toLowerCase() === 'retry-after') {
      return (headers as Record<string, unknown>)[name] !== undefined
    }
  }
  return false
}

/**
 * True for a handler's response that must not be stored: a 5xx, a retryable 4xx (408, 409, 425, 429), or any other
 * 4xx with `Retry-After` (the server asks to be asked again). Such a response is sent as it is and the key released.
 * A success with `Retry-After` (a 202 telling the client when to poll) is stored like any success: running its
 * handler again would start the work twice.
 */
export function isRetryableResponse(status: number, headers: unknown): boolean {
  if (status >= 500 || RETRYABLE_4XX.has(status)) return true
  return status >= 400 && headers !== undefined && hasRetryAfter(headers)
}

/**
 * The default classification of a thrown error: an HTTP 4xx (`statusCode` or `status`, as http-errors and Fastify
 * errors carry) is a permanent business rejection, except the retryable ones (408, 409, 425, 429, or an error whose
 * `headers` carry `Retry-After`); everything else (5xx, timeouts, network errors, Postgres serialization failures
 * 40001 and deadlocks 40P01, unknown errors) is retryable, because re-executing a failed attempt whose writes were
 * rolled back is safe and storing a transient failure is not.
 */
export function defaultClassify(error: unknown): ErrorClass {
  const status = httpStatusOf(error)
  if (status === undefined || status < 400 || status >= 500) return 'retryable'
  return isRetryableResponse(status, (error as { headers?: unknown }).headers) ? 'retryable' : 'permanent'
}

/** Renders a permanent error as `{ statusCode, code, error, message }` JSON, the shape Fastify's errors have. */
export function defaultRenderError(error: unknown): HandlerResponse {
  const status = httpStatusOf(error) ?? 400
  const e = error as { code?: unknown; name?: unknown; message?: unknown }
  return {
    status,
    headers: { 'content-type': 'application/json; charset=utf-8' },
    body: {
      statusCode: status,
      ...(typeof e?.code === 'string' ? { code: e.code } : {}),
      error: typeof e?.name === 'string' ? e.name : 'Error',
      message: typeof e?.message === 'string' ? e.message : String(error),
    },
  }
}
