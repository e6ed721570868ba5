/**
 * RFC 9457 problem details, with one stable `type` URI and one machine `code` per error. The statuses follow the IETF
 * Idempotency-Key draft: a missing or malformed key is 400, a key reused with another payload 422, a request still
 * outstanding 409.
 */

/** Every error oncely answers with, and its HTTP status and title. */
export const PROBLEMS = {
  idempotency_key_missing: { status: 400, title: 'Idempotency-Key header is required' },
  idempotency_key_malformed: { status: 400, title: 'Idempotency-Key header is malformed' },
  idempotency_key_too_long: { status: 400, title: 'Idempotency-Key is longer than 255 characters' },
  idempotency_key_repeated: { status: 400, title: 'Idempotency-Key header appears more than once' },
  invalid_json: { status: 400, title: 'Request body is not acceptable JSON' },
  idempotency_key_reused: { status: 422, title: 'Idempotency-Key was already used with a different request' },
  request_in_progress: { status: 409, title: 'A request with this Idempotency-Key is still being processed' },
  payload_too_large: { status: 413, title: 'Request body is too large' },
  unsupported_media_type: { status: 415, title: 'Unsupported content type' },
  response_too_large: { status: 500, title: 'Response is too large to be stored for replay' },
  store_unavailable: { status: 503, title: 'Idempotency store is unavailable' },
  lease_expired: { status: 503, title: 'The attempt lost its lease before it finished' },
} as const satisfies Record<string, { status: number; title: string }>

/** A machine-readable error code. */
export type ProblemCode = keyof typeof PROBLEMS

/** Prefix of every oncely problem `type` URI. */
export const PROBLEM_TYPE_PREFIX = 'urn:oncely:problem:'

/** The stable `type` URI of a problem code, such as `urn:oncely:problem:idempotency_key_reused`. */
export function problemType(code: ProblemCode): string {
  return `${PROBLEM_TYPE_PREFIX}${code}`
}

/** An RFC 9457 problem details object, with oncely's machine `code`. */
export interface ProblemDetails {
  /** A URI reference that identifies the problem type. */
  type: string
  /** A short, human-readable summary of the problem type. */
  title: string
  /** The HTTP status code. */
  status: number
  /** A human-readable explanation specific to this occurrence. */
  detail?: string
  /** A stable machine-readable code, such as `idempotency_key_reused`. */
  code?: string
  /** Extension members. */
  [member: string]: unknown
}

/**
 * Builds the problem details for one of oncely's own errors.
 *
 * @example
 * problem('request_in_progress', 'Retry after 2 seconds.')
 * // { type: 'urn:oncely:problem:request_in_progress', title: '...', status: 409, detail: '...', code: '...' }
 */
export function problem(
  code: ProblemCode,
  detail?: string,
  extensions: Record<string, unknown> = {},
): ProblemDetails {
  const { status, title } = PROBLEMS[code]
  return { type: problemType(code), title, status, ...(detail ? { detail } : {}), code, ...extensions }
}

/** True when `value` looks like RFC 9457 problem details (has a numeric `status` and a string `title` or `type`). */
export function isProblemDetails(value: unknown): value is ProblemDetails {
  if (typeof value !== 'object' || value === null) return false
  const candidate = value as Record<string, unknown>
  return (
    typeof candidate.status === 'number' &&
    (typeof candidate.title === 'string' || typeof candidate.type === 'string')
  )
}
