/**
 * RFC 9457 problem details, with one stable `type` URI and one machine `code` per error. The statuses follow the IETF
 * Idempotency-Key draft: a missing or malformed key is 400, a key reused with another payload 422, a request still
 * outstanding 409.
 */

// The problems of one status, each code with its title, as entries of {@link PROBLEMS}.
function ofStatus<const S extends number, const T extends Record<string, string>>(
  status: S,
  titles: T,
): { readonly [C in keyof T]: { readonly status: S; readonly title: T[C] } } {
  const problems: Record<string, { status: number; title: string }> = {}
  for (const [code, title] of Object.entries(titles)) problems[code] = { status, title }
  return problems as never
}

/** Every error oncely answers with, and its HTTP status and title. */
export const PROBLEMS = {
  .../* @__PURE__ */ ofStatus(400, {
    idempotency_key_missing: 'Idempotency-Key header is required',
    idempotency_key_malformed: 'Idempotency-Key header is malformed',
    idempotency_key_too_long: 'Idempotency-Key is longer than 255 characters',
    idempotency_key_repeated: 'Idempotency-Key header appears more than once',
    invalid_json: 'Request body is not acceptable JSON',
  }),
  .../* @__PURE__ */ ofStatus(422, {
    idempotency_key_reused: 'Idempotency-Key was already used with a different request',
  }),
  .../* @__PURE__ */ ofStatus(409, {
    request_in_progress: 'A request with this Idempotency-Key is still being processed',
  }),
  .../* @__PURE__ */ ofStatus(413, { payload_too_large: 'Request body is too large' }),
  .../* @__PURE__ */ ofStatus(415, { unsupported_media_type: 'Unsupported content type' }),
  .../* @__PURE__ */ ofStatus(500, { response_too_large: 'Response is too large to be stored for replay' }),
  .../* @__PURE__ */ ofStatus(503, {
    store_unavailable: 'Idempotency store is unavailable',
    lease_expired: 'The attempt lost its lease before it finished',
  }),
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
