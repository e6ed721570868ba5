import { nameOf, OncelyServerError } from './oncely-server-error.js'

/**
 * Redis did not answer a soft-lease command within `timeoutMs` (`withSoftLease`): what its `onError` receives. The
 * request went on as `onRedisError` says (through to Postgres, or answered `unavailable`).
 */
export class RedisTimeoutError extends OncelyServerError {
  override name = 'RedisTimeoutError' as const
  /** The timeout that ran out, in ms. */
  readonly timeoutMs: number
  constructor(timeoutMs: number) {
    super(`Redis did not answer within ${timeoutMs} ms.`)
    this.timeoutMs = timeoutMs
  }
}

/** True for a {@link RedisTimeoutError}, also across bundles. */
export function isRedisTimeoutError(error: unknown): error is RedisTimeoutError {
  return error instanceof RedisTimeoutError || nameOf(error) === 'RedisTimeoutError'
}
