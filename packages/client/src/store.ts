import type { IntentRecord } from './intent.js'

/** Events a store can report to the client that uses it (see `client.on`). */
export interface StoreEvents {
  /** The preferred storage is unavailable (for example IndexedDB in private mode); intents now live in memory. */
  'storage-fallback': { store: string; reason: string; error: unknown }
  /** A corrupt entry was moved aside instead of crashing the client. */
  quarantined: { store: string; id: string; location: string; reason: string }
  /**
   * The store could no longer vouch for this process's claim on an intent while driving it (a lease renewal failed
   * or came too late, or another process replaced the claim): another process may be driving the same intent. The
   * server's key check still makes both drives one effect; this is for monitoring. Emitted once per claim, when
   * the loss is noticed.
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
   * `false` when losing this write in a crash is harmless, because the record it replaces is already durable and
   * resending it reuses the same key (attempt counters, outcomes, the delete after a one-off intent settled). A
   * store may then skip flushing to disk, but a crash must still leave the previous or the new record, never a
   * torn one. The client passes `false` for every write after the write-ahead one.
   * @default true
   */
  durable?: boolean
}

/**
 * Where intents live between attempts, reloads and restarts. Implement these four methods to plug in any storage;
 * records are plain JSON values.
 *
 * Rules: `set` must be durable when its promise resolves (the client sends nothing before that), unless called
 * with `{ durable: false }` (see {@link WriteOptions}; a store may ignore it and always write durably); `get` and `list`
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
   * storage, or returns `{ acquired: false }` at once when someone else holds it. Without it, two tabs may drive
   * the same intent at once (the server's key check still makes that safe).
   */
  exclusive?<T>(id: string, fn: () => Promise<T>): Promise<ExclusiveResult<T>>
  /** Optional: lets the store report events through the client. Called once by `createClient`. */
  attach?(sink: StoreEventSink): void
  /** Optional: releases connections or handles. */
  close?(): Promise<void>
}
