import type { IntentStore } from '../store.js'
import { memoryStore } from './memory.js'

/** Memory, with a warning: intents then do not survive a restart. The default outside browsers. */
export function defaultStore(): IntentStore {
  console.warn(
    '[oncely] No durable store configured; pending intents live in memory and are lost on restart. Pass `store: fileStore({ dir })` (Node) or `asyncStorageStore(AsyncStorage)` (React Native).',
  )
  return memoryStore()
}
