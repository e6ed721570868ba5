/** The base class of every error the client throws, so one `instanceof` (or {@link isOncelyError}) catches them all. */
export class OncelyError extends Error {
  override name: string = 'OncelyError'
}

/** True for any error thrown by oncely, also across realms and duplicated bundles (checks the name chain). */
export function isOncelyError(error: unknown): error is OncelyError {
  return error instanceof OncelyError || hasName(error, ONCELY_ERROR_NAMES)
}

// Every subclass name, so the cross-realm guard needs no instanceof.
const ONCELY_ERROR_NAMES = new Set([
  'OncelyError',
  'HTTPError',
  'IdempotencyKeyReusedError',
  'RetryExhaustedError',
  'IntentExpiredError',
  'NetworkError',
  'StorageError',
  'QuotaExceededError',
  'CorsError',
])

/** Shared guard helper: `error.name` is one of `names`. */
export function hasName(error: unknown, names: ReadonlySet<string> | string): boolean {
  if (typeof error !== 'object' || error === null) return false
  const name = (error as { name?: unknown }).name
  if (typeof name !== 'string') return false
  return typeof names === 'string' ? name === names : names.has(name)
}
