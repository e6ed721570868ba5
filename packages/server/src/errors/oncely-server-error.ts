/**
 * The base class of every error `@oncely/server` throws at its users, so one `instanceof` (or
 * {@link isOncelyServerError}) tells oncely's errors from the application's and the database driver's.
 */
export class OncelyServerError extends Error {
  override name: string = 'OncelyServerError'
}

// Every subclass's name, so that the guards also work across bundles (two copies of the package) without instanceof.
const NAMES = new Set([
  'OncelyServerError',
  'ResponseTooLargeError',
  'StoreSetupError',
  'StepFencedOutError',
  'NoStreamForSubjectError',
  'RedisTimeoutError',
])

/** True for any error thrown by `@oncely/server`, also across bundles (checks the name). */
export function isOncelyServerError(error: unknown): error is OncelyServerError {
  return error instanceof OncelyServerError || NAMES.has(nameOf(error) ?? '')
}

/** The error's `name`, if it is an object with a string name. */
export function nameOf(error: unknown): string | undefined {
  const name = (error as { name?: unknown } | null | undefined)?.name
  return typeof name === 'string' ? name : undefined
}
