import { hasName, OncelyError } from './oncely-error.js'

/**
 * The intent is older than `intentTtlMs`: the server may already have forgotten its key, so resending could act
 * twice. The outcome is unknown; the intent stays listable in `client.pending()` for reconciliation until
 * `client.discard(id)`.
 */
export class IntentExpiredError extends OncelyError {
  override name = 'IntentExpiredError' as const
  /** The intent's id. */
  readonly intentId: string
  /** The idempotency key the intent was sent with; look it up on the server to learn the outcome. */
  readonly key: string
  /** When the intent expired, in ms since the epoch. */
  readonly expiresAt: number

  constructor(init: { intentId: string; key: string; expiresAt: number }) {
    super(
      `Intent ${init.intentId} expired at ${new Date(init.expiresAt).toISOString()} before it was confirmed; its outcome is unknown and it is not resent`,
    )
    this.intentId = init.intentId
    this.key = init.key
    this.expiresAt = init.expiresAt
  }
}

/** True when `error` is an {@link IntentExpiredError}, also across realms. */
export function isIntentExpiredError(error: unknown): error is IntentExpiredError {
  return error instanceof IntentExpiredError || hasName(error, 'IntentExpiredError')
}
