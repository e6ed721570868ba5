import { StorageError } from '../errors/storage-error.js'
import { type IntentRecord, isIntentRecord } from '../intent.js'
import type { IntentStore, StoreEventSink } from '../store.js'
import { OptionChecks } from '../validate.js'

/** The subset of `@react-native-async-storage/async-storage` this store uses (so there is no dependency on it). */
export interface AsyncStorageLike {
  getItem(key: string): Promise<string | null>
  setItem(key: string, value: string): Promise<void>
  removeItem(key: string): Promise<void>
}

/** Options of {@link asyncStorageStore}. */
export interface AsyncStorageStoreOptions {
  /**
   * Prefix of every key this store writes.
   * @default 'oncely:'
   * @example 'payments:'
   */
  prefix?: string
}

/**
 * Keeps intents in React Native's AsyncStorage: one item per intent plus an index item listing their ids.
 * Pass the AsyncStorage object itself; nothing from React Native is imported.
 *
 * A write-ahead record (and `discard`) updates the index and the item. A `{ durable: false }` write (attempt
 * counters, outcomes) writes the item only, and the delete after an answer removes the item only: its id stays in
 * the index, where `list()` skips it, until the next write-ahead or discard rewrites the index without it.
 *
 * @example
 * import AsyncStorage from '@react-native-async-storage/async-storage'
 * import { asyncStorageStore } from '@oncely/client/react-native'
 * createClient({ baseUrl, store: asyncStorageStore(AsyncStorage) })
 */
export function asyncStorageStore(
  storage: AsyncStorageLike,
  options: AsyncStorageStoreOptions = {},
): IntentStore {
  const checks = new OptionChecks('asyncStorageStore', options)
  for (const method of ['getItem', 'setItem', 'removeItem'] as const) {
    if (typeof storage?.[method] !== 'function') {
      checks.problem(`Expected \`storage.${method}\` to be a function (pass AsyncStorage)`)
    }
  }
  if (options.prefix !== undefined && typeof options.prefix !== 'string') {
    checks.problem(`Expected \`prefix\` to be a string, got ${String(options.prefix)}`)
  }
  checks.done()
  const prefix = options.prefix ?? 'oncely:'
  const indexKey = `${prefix}index`
  const itemKey = (id: string) => `${prefix}intent:${id}`
  let sink: StoreEventSink | undefined
  // Index updates are read-modify-write; chaining them keeps two concurrent writers from losing an id.
  let indexQueue: Promise<unknown> = Promise.resolve()

  const guard = async <T>(op: () => Promise<T>): Promise<T> => {
    try {
      return await op()
    } catch (error) {
      throw error instanceof StorageError
        ? error
        : new StorageError(`AsyncStorage failed: ${(error as Error)?.message ?? String(error)}`, {
            cause: error,
          })
    }
  }
  const readIndex = async (): Promise<string[]> => {
    const text = await storage.getItem(indexKey)
    if (text === null) return []
    try {
      const ids = JSON.parse(text) as unknown
      if (Array.isArray(ids) && ids.every((id) => typeof id === 'string')) return ids
    } catch {}
    sink?.('quarantined', {
      store: 'asyncStorage',
      id: '',
      location: indexKey,
      reason: 'corrupt index; rebuilt',
    })
    return []
  }
  // Ids whose item was removed without an index update; the next index update drops them.
  const unindexed = new Set<string>()
  const updateIndex = (change: (ids: Set<string>) => void) => {
    const next = indexQueue.then(async () => {
      const ids = new Set(await readIndex())
      for (const id of unindexed) ids.delete(id)
      unindexed.clear()
      change(ids)
      await storage.setItem(indexKey, JSON.stringify([...ids]))
    })
    indexQueue = next.catch(() => {})
    return next
  }
  const read = async (id: string): Promise<IntentRecord | undefined> => {
    const text = await storage.getItem(itemKey(id))
    if (text === null) return undefined
    try {
      const value = JSON.parse(text) as unknown
      if (isIntentRecord(value) && value.id === id) return value
    } catch {}
    // Keep the bytes under another key for inspection, and stop listing them.
    await storage.setItem(`${prefix}quarantine:${id}`, text)
    await storage.removeItem(itemKey(id))
    await updateIndex((ids) => ids.delete(id))
    sink?.('quarantined', {
      store: 'asyncStorage',
      id,
      location: `${prefix}quarantine:${id}`,
      reason: 'corrupt record',
    })
    return undefined
  }

  return {
    attach(next) {
      sink = next
    },
    get: (id) => guard(() => read(id)),
    set: (record, writeOptions) =>
      guard(async () => {
        // A `{ durable: false }` write replaces a record whose id the index already holds (its write-ahead put it
        // there), so only the item is written.
        if (writeOptions?.durable === false) {
          unindexed.delete(record.id)
          return storage.setItem(itemKey(record.id), JSON.stringify(record))
        }
        // Index first: a crash in between leaves an id without its item (skipped by list), never an item that
        // list() cannot find.
        await updateIndex((ids) => ids.add(record.id))
        await storage.setItem(itemKey(record.id), JSON.stringify(record))
      }),
    delete: (id, writeOptions) =>
      guard(async () => {
        await storage.removeItem(itemKey(id))
        // The id left in the index is skipped by list() and dropped by the next update of the index.
        if (writeOptions?.durable !== false) await updateIndex((ids) => ids.delete(id))
        else unindexed.add(id)
      }),
    list: () =>
      guard(async () => {
        const records = await Promise.all((await readIndex()).map(read))
        return records.filter((record): record is IntentRecord => record !== undefined)
      }),
  }
}
