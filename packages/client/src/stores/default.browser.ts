import type { IntentStore } from '../store.js'
import { defaultStore as withoutIndexedDb } from './default.js'
import { indexedDbStore } from './idb.js'

/** IndexedDB where the page has it, else memory with a warning. The default of the browser build. */
export function defaultStore(): IntentStore {
  if (typeof indexedDB !== 'undefined' && typeof window !== 'undefined') return indexedDbStore()
  return withoutIndexedDb()
}
