import { QuotaExceededError } from '../../errors/quota-exceeded-error.js'
import { StorageError } from '../../errors/storage-error.js'
import type { WriteOptions } from '../../store.js'

/** The object store holding the intents, keyed by intent id. */
export const INTENTS = 'intents'

/**
 * One IndexedDB database, opened on first use and reopened if the browser closes the connection (Safari does in
 * background tabs) or another tab upgrades it.
 */
export class IdbConnection {
  #dbp: Promise<IDBDatabase> | undefined
  // The connection once open, so that a write needs no promise hop to reach it.
  #opened: IDBDatabase | undefined

  constructor(
    readonly name: string,
    readonly durability: IDBTransactionDurability,
  ) {}

  /** Whether the connection is open right now. */
  get isOpen(): boolean {
    return this.#opened !== undefined
  }

  open(): Promise<IDBDatabase> {
    if (this.#dbp) return this.#dbp
    // No version: after another tab upgraded the database, reopening at "whatever is current" still works.
    const request = indexedDB.open(this.name)
    request.onupgradeneeded = () => {
      request.result.createObjectStore(INTENTS)
    }
    const opening = settled(request)
    this.#dbp = opening
    const forget = () => {
      if (this.#dbp !== opening) return
      this.#dbp = undefined
      this.#opened = undefined
    }
    opening.then(
      (db) => {
        if (this.#dbp === opening) this.#opened = db
        // Forget a connection the browser closed, so the next call reopens it.
        db.onclose = forget
        // Let a newer version (another tab upgrading) proceed; we reopen on next use.
        db.onversionchange = () => {
          db.close()
          forget()
        }
      },
      () => {
        if (this.#dbp === opening) this.#dbp = undefined
      },
    )
    return opening
  }

  /** Runs `op` on the intents in a read-only transaction of its own. */
  async read<T>(op: (store: IDBObjectStore) => Promise<T>): Promise<T> {
    const db = await this.open()
    return op(db.transaction(INTENTS, 'readonly', { durability: this.durability }).objectStore(INTENTS))
  }

  /**
   * One write in its own transaction, committed at once rather than after its request's success event came back
   * from the storage backend (one round trip less). A durable write resolves once the transaction completed. A
   * `{ durable: false }` write (attempt counters, outcomes, the delete after an answer) is relaxed and resolves as
   * soon as it is committed: the browser completes a committed transaction even when the page closes right after
   * (a browser crash or power loss may lose it, and the durable write-ahead record it replaces is then resent
   * with the same key). Writes commit in order, so a reader never sees an older version after a newer one.
   */
  async write(options: WriteOptions | undefined, op: (store: IDBObjectStore) => void): Promise<void> {
    const db = this.#opened ?? (await this.open())
    const durable = options?.durable !== false
    const tx = db.transaction(INTENTS, 'readwrite', { durability: durable ? this.durability : 'relaxed' })
    const done = completed(tx)
    op(tx.objectStore(INTENTS))
    tx.commit?.()
    if (durable) return done
    done.catch(() => {}) // lost relaxed writes leave the previous, durable version
  }

  /** Closes the connection; the next use reopens it. */
  async close(): Promise<void> {
    const opening = this.#dbp
    this.#dbp = undefined
    this.#opened = undefined
    if (opening) (await opening.catch(() => undefined))?.close()
  }
}

/** The result of an IndexedDB request. */
export function settled<T>(request: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result)
    request.onerror = () => reject(request.error)
  })
}

/** Resolves when a transaction completed; rejects when it aborted or failed. */
function completed(tx: IDBTransaction): Promise<void> {
  return new Promise((resolve, reject) => {
    tx.oncomplete = () => resolve()
    tx.onabort = tx.onerror = () =>
      reject(tx.error ?? new DOMException('The transaction was aborted', 'AbortError'))
  })
}

/** An error for people: its name and message. */
export function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error)
}

/** An IndexedDB failure as the store's documented error: `QuotaExceededError` for a full quota. */
export function toStorageError(error: unknown): StorageError {
  if (error instanceof StorageError) return error
  if (error instanceof Error && error.name === 'QuotaExceededError') {
    return new QuotaExceededError(
      'IndexedDB quota exceeded; the intent was not recorded and nothing was sent',
      {
        cause: error,
      },
    )
  }
  return new StorageError(`IndexedDB failed: ${describe(error)}`, { cause: error })
}
