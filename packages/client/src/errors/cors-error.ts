import { hasName, OncelyError } from './oncely-error.js'

/** The CORS response header of the server that lacks what the client needs. */
export type CorsHeader =
  | 'Access-Control-Allow-Origin'
  | 'Access-Control-Allow-Headers'
  | 'Access-Control-Expose-Headers'

/**
 * The browser kept a cross-origin request or its answer from the client because the server's CORS setup lacks
 * what oncely needs: this page's origin (`Access-Control-Allow-Origin`), a request header the client sends
 * (`Access-Control-Allow-Headers`, such as `Oncely-Attempt`), or a response header the client reads
 * (`Access-Control-Expose-Headers`, such as `Retry-After`). Resending cannot help until the server is fixed, so
 * the run ends at once; the intent stays pending, and `client.resume()` sends it with the same key once it is.
 */
export class CorsError extends OncelyError {
  override name = 'CorsError' as const
  /** The intent's id. */
  readonly intentId: string
  /** The idempotency key the intent carries. */
  readonly key: string
  /** The server's origin, such as `https://api.example.com`. */
  readonly origin: string
  /** The CORS header to fix on the server. */
  readonly corsHeader: CorsHeader
  /** The header names to add to it (none for `Access-Control-Allow-Origin`). */
  readonly headers: readonly string[]

  constructor(init: {
    intentId: string
    key: string
    origin: string
    corsHeader: CorsHeader
    headers: readonly string[]
    cause?: unknown
  }) {
    const fix = init.headers.length
      ? `add ${init.headers.join(', ')} to ${init.corsHeader}`
      : `allow this page's origin in ${init.corsHeader}`
    super(
      `CORS blocked the request to ${init.origin}: ${fix} (see the CORS section of @oncely/client's README). The intent stays pending for resume().`,
      { cause: init.cause },
    )
    this.intentId = init.intentId
    this.key = init.key
    this.origin = init.origin
    this.corsHeader = init.corsHeader
    this.headers = init.headers
  }
}

/** True when `error` is a {@link CorsError}, also across realms. */
export function isCorsError(error: unknown): error is CorsError {
  return error instanceof CorsError || hasName(error, 'CorsError')
}
