import { hasName, OncelyError } from './oncely-error.js'

/**
 * One attempt got no HTTP response: the connection failed, was reset, or timed out. Always retried. `cause` is the
 * runtime's own error ("Failed to fetch", "fetch failed" with an undici cause, ky's `TimeoutError`, ...).
 */
export class NetworkError extends OncelyError {
  override name = 'NetworkError' as const
  /** True when the attempt hit `timeoutMs`. */
  readonly timedOut: boolean

  constructor(cause: unknown, timedOut: boolean) {
    const message = cause instanceof Error ? cause.message : String(cause)
    super(timedOut ? `Request timed out: ${message}` : `Network error: ${message}`, { cause })
    this.timedOut = timedOut
  }
}

/** True when `error` is a {@link NetworkError}, also across realms. */
export function isNetworkError(error: unknown): error is NetworkError {
  return error instanceof NetworkError || hasName(error, 'NetworkError')
}
