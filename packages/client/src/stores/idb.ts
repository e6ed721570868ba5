import { QuotaExceededError } from '../errors/quota-exceeded-error.js'
import { StorageError } from '../errors/storage-error.js'
import { type IntentRecord, isIntentRecord } from '../intent.js'
import type { ExclusiveResult, IntentStore, StoreEventSink, WriteOptions } from '../store.js'
import { OptionChecks } from '../validate.js'
import { HeldClaim } from './claim.js'
import { memoryStore } from './memory.js'

/** Options of {@link indexedDbStore}. */
export interface IndexedDbStoreOptions {
  /**
   * Database name; clients sharing it share their intents (across tabs of one origin).
   * @default 'oncely'
   * @example 'checkout'
   */
  name?: string
  /**
   * Transaction durability of the write-ahead record (and of `discard`). `'strict'` waits until the write reached
   * the disk (survives power loss); `'relaxed'` and `'default'` leave flushing to the browser (survive a closed
   * or crashed tab, not a power loss). Writes the client marks `{ durable: false }` (attempt counters, outcomes,
   * the delete after an answer) are always relaxed.
   * @default 'strict'
   * @example 'relaxed'
   */
  durability?: 'strict' | 'relaxed' | 'default'
  /**
   * What to do when IndexedDB cannot be opened (Firefox private mode, disabled storage): `'memory'` keeps intents
   * in memory and emits `storage-fallback`; `'fail'` rejects every request with a `StorageError` (fail closed).
   * @default 'memory'
   * @example 'fail'
   */
  fallback?: 'memory' | 'fail'
}

const INTENTS = 'intents'
// Names the tab that created an intent and drives it without a per-intent claim, on the stored value.
const OWNER = 'oncely:owner'
// How long a tab keeps its owner Web Lock after its last owned intent settled: held while mutations keep coming
// (taking it costs a Web Lock round trip), let go when idle (a page holding a Web Lock may not enter the
// back/forward cache).
const OWNER_IDLE_MS = 3_000

type Stored = IntentRecord & { [OWNER]?: string }

// One intent this tab drives right now.
interface Section {
  /** Driven as its creator and owner, without a per-intent claim. */
  owned: boolean
  /** The last record this section wrote, and whether it deleted it since. */
  last?: IntentRecord
  deleted?: boolean
}

/**
 * Keeps intents in IndexedDB, so they survive reloads and browser restarts. The database is opened
 * on first use and reopened if the browser closes the connection (Safari does in background tabs).
 *
 * A new intent costs one transaction before its first byte, and no claim: the tab that creates it holds a Web Lock
 * naming it as owner (kept while it sends mutations, let go of after a few idle seconds), the record names that
 * owner, and another tab drives the intent only once the owner's Web Lock is gone (the tab closed) or the owner let
 * go of it, under a per-intent Web Lock. Without Web Locks (Safari before 15.4, Firefox before 96) tabs are not
 * kept apart: two tabs may drive one intent at once, and the server's key check keeps that to one effect.
 *
 * @example
 * createClient({ baseUrl, store: indexedDbStore({ durability: 'strict' }) })
 */
export function indexedDbStore(options: IndexedDbStoreOptions = {}): IntentStore {
  const checks = new OptionChecks('indexedDbStore', options)
  if (options.name !== undefined && (typeof options.name !== 'string' || options.name === '')) {
    checks.problem(`Expected \`name\` to be a non-empty string, got ${String(options.name)}`)
  }
  const name = options.name ?? 'oncely'
  const durability = checks.oneOf(
    'durability',
    options.durability,
    ['strict', 'relaxed', 'default'],
    'strict',
  )
  const fallbackMode = checks.oneOf('fallback', options.fallback, ['memory', 'fail'], 'memory')
  if ((options as { leaseMs?: unknown }).leaseMs !== undefined) {
    // Removed before 1.0: tabs are kept apart with Web Locks, so a lease here would only mislead.
    checks.problem('`leaseMs` was removed: tabs are kept apart with Web Locks; remove the option')
  }
  checks.done()
  let sink: StoreEventSink | undefined
  let dbp: Promise<IDBDatabase> | undefined
  // The connection once open, so that a write needs no promise hop to reach it.
  let opened: IDBDatabase | undefined
  let fallback: IntentStore | undefined
  const sections = new Map<string, Section>()
  const tab = new TabOwner(name)
  const webLocks = () => (typeof navigator === 'undefined' ? undefined : navigator.locks)

  const open = (): Promise<IDBDatabase> => {
    if (dbp) return dbp
    // No version: after another tab upgraded the database, reopening at "whatever is current" still works.
    const request = indexedDB.open(name)
    request.onupgradeneeded = () => {
      request.result.createObjectStore(INTENTS)
    }
    const opening = settled(request)
    dbp = opening
    const forget = () => {
      if (dbp !== opening) return
      dbp = undefined
      opened = undefined
    }
    opening.then(
      (db) => {
        if (dbp === opening) opened = db
        // Forget a connection the browser closed, so the next call reopens it.
        db.onclose = forget
        // Let a newer version (another tab upgrading) proceed; we reopen on next use.
        db.onversionchange = () => {
          db.close()
          forget()
        }
      },
      () => {
        if (dbp === opening) dbp = undefined
      },
    )
    return opening
  }

  // Runs `op` on an object store in a transaction of its own.
  const inStore = <T>(
    storeName: string,
    mode: IDBTransactionMode,
    op: (store: IDBObjectStore) => Promise<T>,
  ) => open().then((db) => op(db.transaction(storeName, mode, { durability }).objectStore(storeName)))

  // One write in its own transaction, committed at once rather than after its request's success event came back
  // from the storage backend (one round trip less). A durable write resolves once the transaction completed. A
  // `{ durable: false }` write (attempt counters, outcomes, the delete after an answer) is relaxed and resolves as
  // soon as it is committed: the browser completes a committed transaction even when the page closes right after
  // (a browser crash or power loss may lose it, and the durable write-ahead record it replaces is then resent
  // with the same key). Writes commit in order, so a reader never sees an older version after a newer one.
  const write = async (
    options: WriteOptions | undefined,
    op: (store: IDBObjectStore) => void,
  ): Promise<void> => {
    const db = opened ?? (await open())
    const durable = options?.durable !== false
    const tx = db.transaction(INTENTS, 'readwrite', { durability: durable ? durability : 'relaxed' })
    const done = completed(tx)
    op(tx.objectStore(INTENTS))
    tx.commit?.()
    if (durable) return done
    done.catch(() => {}) // lost relaxed writes leave the previous, durable version
  }

  // Runs `op` on IndexedDB, or on the memory fallback once IndexedDB proved unusable.
  const run = async <T>(op: () => Promise<T>, onFallback: (store: IntentStore) => Promise<T>): Promise<T> => {
    if (fallback) return onFallback(fallback)
    try {
      if (typeof indexedDB === 'undefined')
        throw new StorageError('IndexedDB is not available in this environment')
      if (!opened) await open()
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

  const readStored = (id: string): Promise<Stored | undefined> =>
    run(
      async () => {
        const value = await inStore(INTENTS, 'readonly', (store) => settled(store.get(id)))
        return isIntentRecord(value) ? (value as Stored) : undefined
      },
      (store) => store.get(id),
    )

  const set = (record: IntentRecord, writeOptions?: WriteOptions) =>
    run(
      () => {
        const section = sections.get(record.id)
        const stored: Stored = section?.owned && tab.token ? { ...record, [OWNER]: tab.token } : { ...record }
        if (section) {
          section.last = record
          section.deleted = false
        }
        return write(writeOptions, (store) => store.put(stored, record.id))
      },
      (store) => store.set(record),
    )

  // Lets go of an intent this tab created and still holds (not deleted): its record then names no owner.
  const endSection = async (id: string, section: Section) => {
    sections.delete(id)
    if (section.owned && section.last && !section.deleted) {
      await write({ durable: false }, (store) => store.put({ ...section.last }, id)).catch(() => {})
    }
  }

  // Runs `fn` as the only driver of `id` under a Web Lock of its own, unless the tab that created the intent is
  // still open and has not let go of it. A stolen lock loses the claim.
  const underWebLock = async <T>(locks: LockManager, id: string, fn: () => Promise<T>) => {
    const owned = readStored(id).then(
      (value) => value?.[OWNER],
      () => undefined,
    )
    const claim = new HeldClaim('indexedDb', id, () => sink)
    let section: Promise<ExclusiveResult<T>> | undefined
    const requested = locks.request(`oncely:${name}:${id}`, { ifAvailable: true }, async (lock) => {
      if (!lock) return { acquired: false as const }
      const token = await owned
      if (sections.has(id) || (token !== undefined && (await tab.alive(token))))
        return { acquired: false as const }
      const state: Section = { owned: false }
      sections.set(id, state)
      section = claim
        .run(fn, () => endSection(id, state))
        .then((value) => ({ acquired: true as const, value }))
      return section
    })
    return requested.catch((error: unknown) => {
      if (!section) throw error
      claim.lose('its Web Lock was stolen', error)
      return section
    })
  }

  // Without Web Locks (Safari before 15.4, Firefox before 96) tabs are not kept apart: the server's key check
  // keeps two drivers of one intent to one effect.
  const exclusive = async <T>(id: string, fn: () => Promise<T>): Promise<ExclusiveResult<T>> => {
    const locks = webLocks()
    return locks ? underWebLock(locks, id, fn) : { acquired: true, value: await fn() }
  }

  return {
    attach(next) {
      sink = next
    },
    async get(id) {
      const value = await readStored(id)
      if (!value) return undefined
      const { [OWNER]: _owner, ...record } = value
      return record
    },
    set,
    delete: (id, writeOptions) =>
      run(
        () => {
          const section = sections.get(id)
          if (section) section.deleted = true
          return write(writeOptions, (store) => store.delete(id))
        },
        (store) => store.delete(id),
      ),
    list: () =>
      run(
        async () =>
          (await inStore(INTENTS, 'readonly', (store) => settled(store.getAll())))
            .filter(isIntentRecord)
            .map((value) => {
              const { [OWNER]: _owner, ...record } = value as Stored
              return record
            }),
        (store) => store.list(),
      ),
    exclusive,
    async create<T>(record: IntentRecord, fn: () => Promise<T>): Promise<T> {
      if (
        !webLocks() ||
        !(await run(
          async () => true,
          async () => false,
        ))
      ) {
        // No Web Locks, or one tab's memory: no other tab to keep out.
        await set(record)
        return fn()
      }
      const id = record.id
      const claim = new HeldClaim('indexedDb', id, () => sink)
      const section: Section = { owned: true }
      sections.set(id, section)
      try {
        await tab.hold(id, claim)
        await set(record)
      } catch (error) {
        sections.delete(id)
        tab.drop(id)
        throw toStorageError(error)
      }
      return claim.run(fn, async () => {
        tab.drop(id)
        await endSection(id, section)
      })
    },
    async close() {
      tab.close()
      const opening = dbp
      dbp = undefined
      opened = undefined
      if (opening) (await opening.catch(() => undefined))?.close()
    },
  }
}

/**
 * A tab's claim on the intents it creates: a Web Lock named after a random token, taken before the tab writes its
 * first intent naming that token and held while it drives such intents (and for {@link OWNER_IDLE_MS} after the
 * last one, so a stream of mutations takes it once). Another tab sees the owner alive while that Web Lock is held;
 * the browser lets go of it when the tab closes or crashes. If it is ever stolen, every intent driven on its
 * strength loses its claim.
 */
class TabOwner {
  token: string | undefined
  readonly #sections = new Map<string, HeldClaim>()
  #granted: Promise<void> | undefined
  #release: (() => void) | undefined
  #idle: ReturnType<typeof setTimeout> | undefined

  constructor(readonly name: string) {}

  #lockName(token: string): string {
    return `oncely:${this.name}:owner:${token}`
  }

  /** Registers a section driving intent `id` as this tab's owner, taking the owner Web Lock first if needed. */
  async hold(id: string, claim: HeldClaim): Promise<void> {
    clearTimeout(this.#idle)
    this.#sections.set(id, claim)
    if (!this.#granted) {
      const token = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`
      const granted = new Promise<void>((resolve, reject) => {
        navigator.locks
          .request(this.#lockName(token), { mode: 'exclusive' }, () => {
            this.token = token
            resolve()
            return new Promise<void>((release) => {
              this.#release = release
            })
          })
          .catch((error: unknown) => {
            if (this.token !== token) {
              if (this.#granted === granted) this.#granted = undefined
              return reject(error)
            }
            // Stolen: another context may have judged this tab gone and started on its intents.
            this.#forget()
            for (const section of this.#sections.values())
              section.lose('its tab owner Web Lock was stolen', error)
          })
      })
      this.#granted = granted
    }
    await this.#granted
  }

  /** Unregisters a section; lets go of the owner Web Lock once no section has used it for a while. */
  drop(id: string): void {
    this.#sections.delete(id)
    if (this.#sections.size > 0) return
    clearTimeout(this.#idle)
    this.#idle = setTimeout(() => {
      if (this.#sections.size === 0) this.#forget()
    }, OWNER_IDLE_MS)
  }

  /** Whether the tab that took the owner Web Lock `token` still holds it (this tab does). */
  async alive(token: string): Promise<boolean> {
    if (token === this.token) return true
    const state = await navigator.locks.query()
    return (state.held ?? []).some((lock) => lock.name === this.#lockName(token))
  }

  /** Lets go of the owner Web Lock. */
  close(): void {
    clearTimeout(this.#idle)
    this.#forget()
  }

  #forget(): void {
    this.#release?.()
    this.#release = undefined
    this.#granted = undefined
    this.token = undefined
  }
}

/** The result of an IndexedDB request. */
function settled<T>(request: IDBRequest<T>): Promise<T> {
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
