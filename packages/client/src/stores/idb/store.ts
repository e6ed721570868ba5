import { StorageError } from '../../errors/storage-error.js'
import { type IntentRecord, isIntentRecord } from '../../intent.js'
import type { ExclusiveResult, IntentStore, StoreEventSink, WriteOptions } from '../../store.js'
import { HeldClaim } from '../claim.js'
import { memoryStore } from '../memory.js'
import { describe, type IdbConnection, settled, toStorageError } from './connection.js'
import { TabOwner } from './tab-owner.js'

// Names the tab that created an intent and drives it without a per-intent claim, on the stored value.
const OWNER = 'oncely:owner'

type Stored = IntentRecord & { [OWNER]?: string }

// One intent this tab drives right now.
interface Section {
  /** Driven as its creator and owner, without a per-intent claim. */
  owned: boolean
  /** The last record this section wrote, and whether it deleted it since. */
  last?: IntentRecord
  deleted?: boolean
}

const webLocks = () => (typeof navigator === 'undefined' ? undefined : navigator.locks)

/**
 * The intent store of `indexedDbStore` (see its documentation for the promises it keeps): the sections this tab
 * drives (under a per-intent Web Lock, or as the owner of the intents it created), over one connection, or over
 * memory once IndexedDB proved unusable.
 */
export class IndexedDbStore implements Required<IntentStore> {
  #sink: StoreEventSink | undefined
  #fallback: IntentStore | undefined
  readonly #sections = new Map<string, Section>()
  readonly #tab: TabOwner

  constructor(
    readonly db: IdbConnection,
    readonly fallbackMode: 'memory' | 'fail',
  ) {
    this.#tab = new TabOwner(db.name)
  }

  attach(sink: StoreEventSink): void {
    this.#sink = sink
  }

  async get(id: string): Promise<IntentRecord | undefined> {
    const value = await this.#readStored(id)
    if (!value) return undefined
    const { [OWNER]: _owner, ...record } = value
    return record
  }

  set(record: IntentRecord, options?: WriteOptions): Promise<void> {
    return this.#run(
      () => {
        const section = this.#sections.get(record.id)
        const token = this.#tab.token
        const stored: Stored = section?.owned && token ? { ...record, [OWNER]: token } : { ...record }
        if (section) {
          section.last = record
          section.deleted = false
        }
        return this.db.write(options, (store) => store.put(stored, record.id))
      },
      (store) => store.set(record),
    )
  }

  delete(id: string, options?: WriteOptions): Promise<void> {
    return this.#run(
      () => {
        const section = this.#sections.get(id)
        if (section) section.deleted = true
        return this.db.write(options, (store) => store.delete(id))
      },
      (store) => store.delete(id),
    )
  }

  list(): Promise<IntentRecord[]> {
    return this.#run(
      async () =>
        (await this.db.read((store) => settled(store.getAll()))).filter(isIntentRecord).map((value) => {
          const { [OWNER]: _owner, ...record } = value as Stored
          return record
        }),
      (store) => store.list(),
    )
  }

  // Without Web Locks (Safari before 15.4, Firefox before 96) tabs are not kept apart: the server's key check
  // keeps two drivers of one intent to one effect.
  async exclusive<T>(id: string, fn: () => Promise<T>): Promise<ExclusiveResult<T>> {
    const locks = webLocks()
    return locks ? this.#underWebLock(locks, id, fn) : { acquired: true, value: await fn() }
  }

  async create<T>(record: IntentRecord, fn: () => Promise<T>): Promise<T> {
    if (
      !webLocks() ||
      !(await this.#run(
        async () => true,
        async () => false,
      ))
    ) {
      // No Web Locks, or one tab's memory: no other tab to keep out.
      await this.set(record)
      return fn()
    }
    const id = record.id
    const claim = new HeldClaim('indexedDb', id, () => this.#sink)
    const section: Section = { owned: true }
    this.#sections.set(id, section)
    try {
      await this.#tab.hold(id, claim)
      await this.set(record)
    } catch (error) {
      this.#sections.delete(id)
      this.#tab.drop(id)
      throw toStorageError(error)
    }
    return claim.run(fn, async () => {
      this.#tab.drop(id)
      await this.#endSection(id, section)
    })
  }

  async close(): Promise<void> {
    this.#tab.close()
    await this.db.close()
  }

  // Runs `op` on IndexedDB, or on the memory fallback once IndexedDB proved unusable.
  async #run<T>(op: () => Promise<T>, onFallback: (store: IntentStore) => Promise<T>): Promise<T> {
    if (this.#fallback) return onFallback(this.#fallback)
    try {
      if (typeof indexedDB === 'undefined')
        throw new StorageError('IndexedDB is not available in this environment')
      if (!this.db.isOpen) await this.db.open()
    } catch (error) {
      if (this.fallbackMode === 'fail') {
        throw error instanceof StorageError
          ? error
          : new StorageError('IndexedDB cannot be opened', { cause: error })
      }
      this.#fallback ??= memoryStore()
      this.#sink?.('storage-fallback', { store: 'indexedDb', reason: describe(error), error })
      return onFallback(this.#fallback)
    }
    try {
      return await op()
    } catch (error) {
      throw toStorageError(error)
    }
  }

  #readStored(id: string): Promise<Stored | undefined> {
    return this.#run(
      async () => {
        const value = await this.db.read((store) => settled(store.get(id)))
        return isIntentRecord(value) ? (value as Stored) : undefined
      },
      (store) => store.get(id),
    )
  }

  // Lets go of an intent this tab created and still holds (not deleted): its record then names no owner.
  async #endSection(id: string, section: Section): Promise<void> {
    this.#sections.delete(id)
    if (section.owned && section.last && !section.deleted) {
      await this.db.write({ durable: false }, (store) => store.put({ ...section.last }, id)).catch(() => {})
    }
  }

  // Runs `fn` as the only driver of `id` under a Web Lock of its own, unless the tab that created the intent is
  // still open and has not let go of it. A stolen lock loses the claim.
  async #underWebLock<T>(locks: LockManager, id: string, fn: () => Promise<T>): Promise<ExclusiveResult<T>> {
    const owned = this.#readStored(id).then(
      (value) => value?.[OWNER],
      () => undefined,
    )
    const claim = new HeldClaim('indexedDb', id, () => this.#sink)
    let section: Promise<ExclusiveResult<T>> | undefined
    const requested = locks.request(`oncely:${this.db.name}:${id}`, { ifAvailable: true }, async (lock) => {
      if (!lock) return { acquired: false as const }
      const token = await owned
      if (this.#sections.has(id) || (token !== undefined && (await this.#tab.alive(token))))
        return { acquired: false as const }
      const state: Section = { owned: false }
      this.#sections.set(id, state)
      section = claim
        .run(fn, () => this.#endSection(id, state))
        .then((value) => ({ acquired: true as const, value }))
      return section
    })
    return requested.catch((error: unknown) => {
      if (!section) throw error
      claim.lose('its Web Lock was stolen', error)
      return section
    })
  }
}
