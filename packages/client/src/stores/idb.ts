import { get, promisifyRequest, type UseStore, values } from 'idb-keyval'
import { QuotaExceededError } from '../errors/quota-exceeded-error.js'
import { StorageError } from '../errors/storage-error.js'
import { type IntentRecord, isIntentRecord } from '../intent.js'
import type { ExclusiveResult, IntentStore, StoreEventSink, WriteOptions } from '../store.js'
import { memoryStore } from './memory.js'

/** Options of {@link indexedDbStore}. */
export interface IndexedDbStoreOptions {
  /**
   * Database name; clients sharing it share their intents (across tabs of one origin).
   * @default 'oncely'
   */
  name?: string
  /**
   * Transaction durability of the write-ahead record. `'strict'` waits until the write reached the disk (slower,
   * survives power loss); `'relaxed'` and `'default'` leave it to the browser. Writes the client marks
   * `{ durable: false }` (attempt counters, outcomes, the delete after an answer) are always relaxed.
   * @default 'strict'
   */
  durability?: 'strict' | 'relaxed' | 'default'
  /**
   * What to do when IndexedDB cannot be opened (Firefox private mode, disabled storage): `'memory'` keeps intents
   * in memory and emits `storage-fallback`; `'fail'` rejects every request with a `StorageError` (fail closed).
   * @default 'memory'
   */
  fallback?: 'memory' | 'fail'
  /**
   * How long a tab's claim on an intent lasts without renewal when Web Locks are unavailable (it is renewed while
   * the tab drives the intent, so only a crashed tab's claim ever runs out).
   * @default 10_000
   */
  leaseMs?: number
}

const INTENTS = 'intents'
const LEASES = 'leases'

/**
 * Keeps intents in IndexedDB (via idb-keyval), so they survive reloads and browser restarts. The database is opened
 * on first use and reopened if the browser closes the connection (Safari does in background tabs). Only one tab
 * drives a given intent at a time: Web Locks where available, else a lease written in one IndexedDB transaction.
 *
 * @example
 * createClient({ baseUrl, store: indexedDbStore({ durability: 'strict' }) })
 */
export function indexedDbStore(options: IndexedDbStoreOptions = {}): IntentStore {
  const name = options.name ?? 'oncely'
  const durability = options.durability ?? 'strict'
  const fallbackMode = options.fallback ?? 'memory'
  const leaseMs = options.leaseMs ?? 10_000
  if (fallbackMode !== 'memory' && fallbackMode !== 'fail') {
    throw new TypeError(`Expected \`fallback\` to be 'memory' or 'fail', got ${String(fallbackMode)}`)
  }
  if (!(leaseMs > 0))
    throw new TypeError(`Expected \`leaseMs\` to be a positive number, got ${String(leaseMs)}`)
  let sink: StoreEventSink | undefined
  let dbp: Promise<IDBDatabase> | undefined
  let fallback: IntentStore | undefined
  const owner = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`

  const open = (): Promise<IDBDatabase> => {
    if (dbp) return dbp
    // No version: after another tab upgraded the database, reopening at "whatever is current" still works.
    const request = indexedDB.open(name)
    request.onupgradeneeded = () => {
      request.result.createObjectStore(INTENTS)
      request.result.createObjectStore(LEASES)
    }
    const opening = promisifyRequest(request)
    dbp = opening
    opening.then(
      (db) => {
        // Forget a connection the browser closed, so the next call reopens it.
        db.onclose = () => {
          if (dbp === opening) dbp = undefined
        }
        // Let a newer version (another tab upgrading) proceed; we reopen on next use.
        db.onversionchange = () => {
          db.close()
          if (dbp === opening) dbp = undefined
        }
      },
      () => {
        if (dbp === opening) dbp = undefined
      },
    )
    return opening
  }

  const useStore =
    (storeName: string): UseStore =>
    (mode, callback) =>
      open().then((db) => callback(db.transaction(storeName, mode, { durability }).objectStore(storeName)))
  const intents = useStore(INTENTS)

  // One write in its own transaction, committed at once rather than after its request's success event came back
  // from the storage backend (one round trip less); resolves once the transaction completed. `{ durable: false }`
  // writes (attempt counters, outcomes, the delete after an answer) are relaxed: the durable write-ahead record
  // they replace is enough after a crash. They still commit in order with the other writes, so a reader never sees
  // an older version after a newer one.
  const write = (options: WriteOptions | undefined, op: (store: IDBObjectStore) => void): Promise<void> =>
    open().then(
      (db) =>
        new Promise<void>((resolve, reject) => {
          const tx = db.transaction(INTENTS, 'readwrite', {
            durability: options?.durable === false ? 'relaxed' : durability,
          })
          tx.oncomplete = () => resolve()
          tx.onabort = tx.onerror = () =>
            reject(tx.error ?? new DOMException('The transaction was aborted', 'AbortError'))
          op(tx.objectStore(INTENTS))
          tx.commit?.()
        }),
    )

  // Runs `op` on IndexedDB, or on the memory fallback once IndexedDB proved unusable.
  const run = async <T>(op: () => Promise<T>, onFallback: (store: IntentStore) => Promise<T>): Promise<T> => {
    if (fallback) return onFallback(fallback)
    try {
      if (typeof indexedDB === 'undefined')
        throw new StorageError('IndexedDB is not available in this environment')
      await open()
    } catch (error) {
      if (fallbackMode === 'fail') {
        throw error instanceof StorageError
          ? error
          : new StorageError('IndexedDB cannot be opened', { cause: error })
      }
      fallback ??= memoryStore()
      sink?.('storage-fallback', { store: 'indexedDb', reason: describe(error), error })
      return onFallback(fallback)
    }
    try {
      return await op()
    } catch (error) {
      throw toStorageError(error)
    }
  }

  const claim = async (id: string, mode: 'take' | 'renew' | 'release'): Promise<boolean> =>
    useStore(LEASES)('readwrite', async (leases) => {
      // One transaction: read and write cannot interleave with another tab's.
      const current = (await promisifyRequest(leases.get(id))) as { owner: string; until: number } | undefined
      const now = Date.now()
      const mine = current?.owner === owner
      if (mode === 'release') {
        if (mine) leases.delete(id)
      } else if (mine || !current || current.until <= now) {
        leases.put({ owner, until: now + leaseMs }, id)
      } else return false
      await promisifyRequest(leases.transaction)
      return true
    })

  return {
    attach(next) {
      sink = next
    },
    get: (id) =>
      run(
        async () => {
          const value = await get<unknown>(id, intents)
          return isIntentRecord(value) ? value : undefined
        },
        (store) => store.get(id),
      ),
    set: (record, writeOptions) =>
      run(
        () => write(writeOptions, (store) => store.put(record, record.id)),
        (store) => store.set(record),
      ),
    delete: (id, writeOptions) =>
      run(
        () => write(writeOptions, (store) => store.delete(id)),
        (store) => store.delete(id),
      ),
    list: () =>
      run(
        async () => (await values<unknown>(intents)).filter(isIntentRecord) as IntentRecord[],
        (store) => store.list(),
      ),
    async exclusive<T>(id: string, fn: () => Promise<T>): Promise<ExclusiveResult<T>> {
      const locks = typeof navigator === 'undefined' ? undefined : navigator.locks
      if (locks) {
        return locks.request(`oncely:${name}:${id}`, { ifAvailable: true }, async (lock) =>
          lock ? { acquired: true as const, value: await fn() } : { acquired: false as const },
        )
      }
      if (
        !(await run(
          () => claim(id, 'take'),
          async () => true,
        ))
      )
        return { acquired: false }
      if (fallback) return { acquired: true, value: await fn() } // one tab's memory: nothing to share
      const renew = setInterval(() => void claim(id, 'renew').catch(() => {}), leaseMs / 3)
      try {
        return { acquired: true, value: await fn() }
      } finally {
        clearInterval(renew)
        await claim(id, 'release').catch(() => {})
      }
    },
    async close() {
      const opening = dbp
      dbp = undefined
      if (opening) (await opening.catch(() => undefined))?.close()
    },
  }
}

function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error)
}

function toStorageError(error: unknown): StorageError {
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
