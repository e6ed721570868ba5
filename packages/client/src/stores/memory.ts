import type { IntentRecord } from '../intent.js'
import type { IntentStore } from '../store.js'

/**
 * Keeps intents in this process's memory: they survive retries but not a reload or restart. The default outside
 * browsers; use `fileStore` (Node) or `asyncStorageStore` (React Native) for durability.
 *
 * @example
 * createClient({ baseUrl, store: memoryStore() })
 */
export function memoryStore(): IntentStore {
  const records = new Map<string, string>()
  // Stored as JSON text so callers can never mutate a stored record through a shared reference.
  return {
    async get(id) {
      const text = records.get(id)
      return text === undefined ? undefined : (JSON.parse(text) as IntentRecord)
    },
    async set(record) {
      records.set(record.id, JSON.stringify(record))
    },
    async delete(id) {
      records.delete(id)
    },
    async list() {
      return [...records.values()].map((text) => JSON.parse(text) as IntentRecord)
    },
  }
}
