import type { IntentStore } from '../store.js'
import { OptionChecks } from '../validate.js'
import { IdbConnection } from './idb/connection.js'
import { IndexedDbStore } from './idb/store.js'
import { boundStore } from './methods.js'

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
  checks.nonEmptyString('name', options.name)
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
  return boundStore(new IndexedDbStore(new IdbConnection(name, durability), fallbackMode))
}
