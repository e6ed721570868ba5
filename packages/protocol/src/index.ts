export type { FingerprintInput } from './fingerprint.js'
export { fingerprintMaterial, requestFingerprint } from './fingerprint.js'
export {
  ATTEMPT_HEADER,
  IDEMPOTENCY_KEY_HEADER,
  IDEMPOTENT_REPLAYED_HEADER,
  PROBLEM_CONTENT_TYPE,
  RETRY_AFTER_HEADER,
} from './headers.js'
export type { JsonValue } from './json.js'
export { canonicalJson, JsonSyntaxError, parseStrictJson } from './json.js'
export type { KeyErrorCode, ParsedKey } from './key.js'
export { parseIdempotencyKey } from './key.js'
export type { ProblemCode, ProblemDetails } from './problems.js'
export { isProblemDetails, PROBLEM_TYPE_PREFIX, PROBLEMS, problem, problemType } from './problems.js'
export type { ParseRetryAfterOptions } from './retry-after.js'
export { formatRetryAfter, parseRetryAfter } from './retry-after.js'
