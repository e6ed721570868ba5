/** The request header that carries the idempotency key (IETF draft-ietf-httpapi-idempotency-key-header). */
export const IDEMPOTENCY_KEY_HEADER = 'Idempotency-Key'

/** Set to `true` on a response that is a replay of a stored response (Stripe's convention). */
export const IDEMPOTENT_REPLAYED_HEADER = 'Idempotent-Replayed'

/** The request header in which the client reports which attempt this is (1 for the first), for server telemetry. */
export const ATTEMPT_HEADER = 'Oncely-Attempt'

/** The standard `Retry-After` response header (RFC 9110, section 10.2.3). */
export const RETRY_AFTER_HEADER = 'Retry-After'

/** Media type of every error response (RFC 9457). */
export const PROBLEM_CONTENT_TYPE = 'application/problem+json'
