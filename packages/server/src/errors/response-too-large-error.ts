import { nameOf, OncelyServerError } from './oncely-server-error.js'

/** The handler's response is larger than `maxResponseBytes` and was not stored (the attempt was rolled back). */
export class ResponseTooLargeError extends OncelyServerError {
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
  return error instanceof ResponseTooLargeError || nameOf(error) === 'ResponseTooLargeError'
}
