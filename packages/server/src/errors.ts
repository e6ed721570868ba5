/** The handler's response is larger than `maxResponseBytes` and was not stored (the attempt was rolled back). */
export class ResponseTooLargeError extends Error {
  override name = 'ResponseTooLargeError' as const
  /** Body size in bytes. */
  readonly size: number
  /** The configured limit in bytes. */
  readonly limit: number
  constructor(size: number, limit: number) {
    super(`The response body has ${size} bytes; at most ${limit} can be stored for replay.`)
    this.size = size
    this.limit = limit
  }
}

/** True for a {@link ResponseTooLargeError}, also across bundles. */
export function isResponseTooLargeError(error: unknown): error is ResponseTooLargeError {
  return (
    error instanceof ResponseTooLargeError || (error as Error | undefined)?.name === 'ResponseTooLargeError'
  )
}

/**
 * The store is not set up for how it is used: its table or schema is missing or older than this version of oncely
 * expects (from `engine.verify()`), or it prepares statements while its connections go through a pooler in
 * transaction mode (the error of an `unavailable` outcome). The message says the fix; the database's own error is the
 * `cause`.
 */
export class StoreSetupError extends Error {
  override name = 'StoreSetupError' as const
  /**
   * The Postgres SQLSTATE that revealed the problem: 42P01 undefined table, 3F000 undefined schema, 42703 undefined
   * column; 26000 or 42P05 for a prepared statement missing or duplicated behind a pooler.
   */
  readonly code: string
  constructor(message: string, code: string, cause: unknown) {
    super(message, { cause })
    this.code = code
  }
}

/** True for a {@link StoreSetupError}, also across bundles. */
export function isStoreSetupError(error: unknown): error is StoreSetupError {
  return error instanceof StoreSetupError || (error as Error | undefined)?.name === 'StoreSetupError'
}
