import type { IntentStore } from '../store.js'
import { indexedDbStore } from './idb.js'
import { memoryStore } from './memory.js'

/** IndexedDB where the page has it, else memory with a warning (intents then do not survive a restart). */
export function defaultStore(): IntentStore {
  if (typeof indexedDB !== 'undefined' && typeof window !== 'undefined') return indexedDbStore()
  console.warn(
    '[oncely] No durable store configured; pending intents live in memory and are lost on restart. Pass `store: fileStore({ dir })` (Node) or `asyncStorageStore(AsyncStorage)` (React Native).',
  )
  return memoryStore()
}
