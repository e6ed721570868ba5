import { HTTPError } from './http-error.js'
import { hasName } from './oncely-error.js'

/**
 * The key was already used for a different request: the server answered 422, or the client found a pending intent
 * with the same `intentId` but another method, URL or body. Never retried: resending cannot succeed.
 */
export class IdempotencyKeyReusedError extends HTTPError {
  override name = 'IdempotencyKeyReusedError' as const
}

/** True when `error` is an {@link IdempotencyKeyReusedError}, also across realms. */
export function isIdempotencyKeyReusedError(error: unknown): error is IdempotencyKeyReusedError {
  return error instanceof IdempotencyKeyReusedError || hasName(error, 'IdempotencyKeyReusedError')
}
