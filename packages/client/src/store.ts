import type { IntentRecord } from './intent.js'

/** Events a store can report to the client that uses it (see `client.on`). */
export interface StoreEvents {
  /** The preferred storage is unavailable (for example IndexedDB in private mode); intents now live in memory. */
  'storage-fallback': { store: string; reason: string; error: unknown }
  /** A corrupt entry was moved aside instead of crashing the client. */
  quarantined: { store: string; id: string; location: string; reason: string }
  /**
   * The store could no longer vouch for this tab's or process's claim on an intent while driving it (a lease
   * renewal failed or came too late, another process replaced the lock file, a Web Lock was stolen, or the owner
   * claim the intent was created under lapsed): another tab or process may be driving the same intent. The
   * server's key check still makes both drives one effect; this is for monitoring. Emitted once per claim, when
   * the loss is noticed; the claimed section then rejects with `StorageError` once it settled.
   */
  'claim-lost': { store: string; id: string; reason: string; error: Error }
}

/** Receives store events; the client forwards them to its `on` listeners. */
export type StoreEventSink = <E extends keyof StoreEvents>(event: E, payload: StoreEvents[E]) => void

/** The result of {@link IntentStore.exclusive}. */
export type ExclusiveResult<T> = { acquired: true; value: T } | { acquired: false }

/** How {@link IntentStore.set} and {@link IntentStore.delete} may write. */
export interface WriteOptions {
  /**
   * `false` when losing this write to a power loss is harmless, because the record it replaces is already durable
   * and resending it reuses the same key (attempt counters, outcomes, the delete after an intent settled). A store
   * may then skip flushing to disk, but once the write resolved a crash of this process or tab must no longer undo
   * it, and a crash must leave the previous or the new record, never a torn one. The client passes `false` for
   * every write after the write-ahead one.
   * @default true
   * @example false
   */
  durable?: boolean
}

/**
 * Where intents live between attempts, reloads and restarts. Implement these four methods to plug in any storage;
 * records are plain JSON values.
 *
 * Rules: `set` must be durable when its promise resolves (the client sends nothing before that), unless called
 * with `{ durable: false }` (see {@link WriteOptions}; a store may ignore it and always write durably); `delete`
 * likewise; a write or delete that resolved is never undone by a crash of this process or tab; `get` and `list`
 * must skip or quarantine corrupt entries rather than throw; all methods may be called concurrently.
 */
export interface IntentStore {
  /** The record with this id, or `undefined`. */
  get(id: string): Promise<IntentRecord | undefined>
  /** Inserts or replaces the record with `record.id`. */
  set(record: IntentRecord, options?: WriteOptions): Promise<void>
  /** Removes the record; a missing record is not an error. */
  delete(id: string, options?: WriteOptions): Promise<void>
  /** Every record, in any order. */
  list(): Promise<IntentRecord[]>
  /**
   * Optional: runs `fn` while holding an exclusive claim on intent `id` across tabs or processes sharing this
   * storage, or returns `{ acquired: false }` at once when someone else holds it or drives it. Without it, two tabs
   * may drive the same intent at once (the server's key check still makes that safe).
   */
  exclusive?<T>(id: string, fn: () => Promise<T>): Promise<ExclusiveResult<T>>
  /**
   * Optional: writes `record`, the write-ahead record of a brand-new intent (its id is a random key nobody else can
   * know yet), durably like `set`, then runs `fn` as the intent's only driver and resolves with its result. The
   * store makes this tab or process the intent's owner when it writes the record, so no other tab or process
   * drives the intent while the owner is alive and no per-intent claim is needed before the first byte; when `fn`
   * settles, the store lets go of the intent (any tab or process may then drive it under `exclusive`). A failed
   * write rejects without running `fn`. Without this method the client writes with `set` and claims the intent
   * with `exclusive`.
   */
  create?<T>(record: IntentRecord, fn: () => Promise<T>): Promise<T>
  /** Optional: lets the store report events through the client. Called once by `createClient`. */
  attach?(sink: StoreEventSink): void
  /** Optional: releases connections or handles. */
  close?(): Promise<void>
}
