import { nameOf, OncelyServerError } from './oncely-server-error.js'

/**
 * The store is not set up for how it is used: its table or schema is missing or older than this version of oncely
 * expects (from `engine.verify()`), or it prepares statements while its connections go through a pooler in
 * transaction mode (the error of an `unavailable` outcome). The message says the fix; the database's own error is the
 * `cause`.
 */
export class StoreSetupError extends OncelyServerError {
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
  return error instanceof StoreSetupError || nameOf(error) === 'StoreSetupError'
}
