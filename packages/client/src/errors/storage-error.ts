import { hasName, OncelyError } from './oncely-error.js'

/**
 * The intent store failed. A write-ahead failure rejects the request before any byte is sent: an intent that cannot
 * be recorded is never sent.
 */
export class StorageError extends OncelyError {
  override name: 'StorageError' | 'QuotaExceededError' = 'StorageError'
}

/** True when `error` is a {@link StorageError} (including {@link QuotaExceededError}), also across realms. */
export function isStorageError(error: unknown): error is StorageError {
  return error instanceof StorageError || hasName(error, STORAGE_ERROR_NAMES)
}

const STORAGE_ERROR_NAMES = new Set(['StorageError', 'QuotaExceededError'])
