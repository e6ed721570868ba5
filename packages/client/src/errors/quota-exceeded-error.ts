import { hasName } from './oncely-error.js'
import { StorageError } from './storage-error.js'

/** The store is full (IndexedDB's or the disk's quota). The request was not sent. `cause` is the store's error. */
export class QuotaExceededError extends StorageError {
  override name = 'QuotaExceededError' as const
}

/** True when `error` is a {@link QuotaExceededError}, also across realms. */
export function isQuotaExceededError(error: unknown): error is QuotaExceededError {
  return error instanceof QuotaExceededError || hasName(error, 'QuotaExceededError')
}
