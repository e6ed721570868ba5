import { hasName, OncelyError } from './oncely-error.js'

/**
 * Every attempt the retry budget allowed failed with a retryable error. The intent stays pending in the store, so a
 * later `client.resume()` re-drives it with the same key and bytes.
 *
 * `errors` holds each attempt's error in order; `cause` is the last one, and each error keeps its own `cause` (such
 * as undici's `ECONNRESET`).
 */
export class RetryExhaustedError extends OncelyError {
  override name = 'RetryExhaustedError' as const
  /** The intent's id. */
  readonly intentId: string
  /** The idempotency key every attempt carried. */
  readonly key: string
  /** The error of every attempt of this run, oldest first. */
  readonly errors: readonly Error[]

  constructor(init: { intentId: string; key: string; errors: readonly Error[]; reason: string }) {
    const last = init.errors.at(-1)
    super(
      `Gave up after ${init.errors.length} attempt${init.errors.length === 1 ? '' : 's'} (${init.reason}); the intent stays pending${last ? `. Last error: ${last.message}` : ''}`,
      { cause: last },
    )
    this.intentId = init.intentId
    this.key = init.key
    this.errors = init.errors
  }
}

/** True when `error` is a {@link RetryExhaustedError}, also across realms. */
export function isRetryExhaustedError(error: unknown): error is RetryExhaustedError {
  return error instanceof RetryExhaustedError || hasName(error, 'RetryExhaustedError')
}
