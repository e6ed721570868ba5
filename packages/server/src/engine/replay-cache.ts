import { performance } from 'node:perf_hooks'
import type { RecordId } from '../store/queries.js'
import type { StoredResponse } from './types.js'

/** Bounds of the in-process cache of finished responses (see `EngineOptions.replayCache`). */
export interface ReplayCacheOptions {
  /** @default 10_000 */
  maxEntries?: number
  /** Approximate bytes held (bodies, headers, ids). @default 16_777_216 (16 MiB) */
  maxBytes?: number
  /**
   * The longest an entry answers, whatever the record's expiry: how long a record deleted outside this process
   * (`engine.forget()` on another instance, or by hand) can still be replayed here.
   * @default 60_000
   */
  maxAgeMs?: number
  /**
   * How long after the store last confirmed which server it is an entry may answer. A finished record can vanish
   * with the database's own past: a restore, or a failover to a standby that missed its commit (which the cache
   * rules out by answering only while the server streams to no asynchronous standby). Every statement of the
   * engine's tells the server it reached (when its postmaster started); another server empties the cache, and
   * without a confirmation this recent (an idle instance, whose connections a pooler kept open) the next request
   * asks the database, which confirms again.
   * @default 1_000
   */
  maxUnconfirmedMs?: number
}

/**
 * How often the engine asks the server whether it streams to a standby that could lose an acknowledged commit in a
 * failover (see {@link ReplayCache.replicationChecked}); and at once after it reaches another server.
 */
export const REPLICATION_CHECK_MS = 10_000
/**
 * The shortest gap between two checks asked for by entries newer than the last check. An entry answers only after a
 * check sent after it was stored (see {@link ReplayCache.get}), so a replay within this long of its original asks
 * the database.
 */
export const REPLICATION_RECHECK_MS = 100

interface Entry {
  // The record's id. The map is keyed by `key` alone, the idempotency key the request already holds: a key built
  // from the three parts would be a new string to allocate, flatten and hash twice per first execution, which
  // measured about a fifth of the engine's own CPU on a datasource that answers at once. Entries of one key under
  // other scopes or operations are chained through `sameKey`.
  scope: string
  operation: string
  key: string
  /** The next entry of the same key (another scope or operation), or undefined. */
  sameKey: Entry | undefined
  fingerprint: string
  status: number
  headers: Record<string, string>
  /**
   * The body's bytes as a latin1 string (one character per byte, so exact): one object on the heap, where a Buffer
   * of its own costs an ArrayBuffer, its memory outside the heap and the collector's work to free both, on every
   * first execution. A view into a larger buffer (Node's pool of small buffers, a slice a handler returned) is never
   * held, so nothing outside the entry is kept alive past what `maxBytes` counts.
   */
  body: string
  /** Evict when either clock reaches its deadline: monotonic (immune to clock steps), wall (counts suspends). */
  monotonicDeadline: number
  wallDeadline: number
  bytes: number
  /** When it was stored (`performance.now()`): it answers only once a replication check sent after that found safe. */
  storedAt: number
  /** Neighbours in recency order (`older` toward the eviction end). */
  older: Entry | undefined
  newer: Entry | undefined
}

// Durations measured on the database clock are trusted to this fraction only, so a slower or faster app clock
// (NTP slews at most 500 ppm) cannot keep an entry past its expiry: 24 h of retention is cut by 86 s.
const CLOCK_RATE_MARGIN = 0.999

/**
 * The most entries one idempotency key keeps (under as many scopes or operations): a lookup walks them, so clients
 * of many tenants that all send the same key (`1`, `2`, ...) cannot make it long. A record past it is not cached,
 * and its replays are answered by the database.
 */
const MAX_SAME_KEY = 8

/**
 * A bounded LRU of finished key records (succeeded or failed_permanent). Such a record cannot change until it
 * expires: the reservation only replaces a finished row once `expires_at` passed, the completion and release only
 * touch a row in progress under their own token, and the reaper only deletes expired rows. So an entry can answer a
 * replay or a mismatch exactly as the database would, until the expiry, which it bounds conservatively: the
 * remaining lifetime comes from the database (`expires_at - now()`) and counts from a local instant taken *before*
 * the statement was sent, so it ends no later than the database's own expiry, whatever the clock offset.
 */
export class ReplayCache {
  // A Map for lookup plus a doubly linked list for recency: O(1) per operation. (Evicting by iterating a Map from
  // its start skips every slot deleted since its last rehash: about 10 us per insert at 10,000 entries, measured.)
  /** The newest entry of each idempotency key, the others chained from it (see Entry). */
  readonly #entries = new Map<string, Entry>()
  #count = 0
  #oldest: Entry | undefined
  #newest: Entry | undefined
  readonly #maxEntries: number
  readonly #maxBytes: number
  readonly #maxAgeMs: number
  readonly #maxUnconfirmedMs: number
  #bytes = 0
  /** The server the entries came from, and when (before which statement) it last confirmed it is still that one. */
  #server: number | undefined
  #confirmedAt = Number.NEGATIVE_INFINITY
  /**
   * What the last replication check found, and on which server. Entries answer only while it found that every
   * commit this server acknowledged is on each standby it streams to (or that it streams to none): under
   * asynchronous replication a failover loses the commits the standby had not received, and an entry of one of them
   * would replay a payment the database no longer has, for up to `maxUnconfirmedMs` after the last statement that
   * reached the old server (continuous traffic confirms the old server until the moment it is gone). No bound on
   * time can close that window; refusing to answer while a standby may lag does.
   */
  #replication: { server: number; safe: boolean; checkedAt: number } | undefined
  /** When the newest entry was stored. */
  #newestStoredAt = Number.NEGATIVE_INFINITY

  constructor(bounds: Required<ReplayCacheOptions>) {
    this.#maxEntries = bounds.maxEntries
    this.#maxBytes = bounds.maxBytes
    this.#maxAgeMs = bounds.maxAgeMs
    this.#maxUnconfirmedMs = bounds.maxUnconfirmedMs
  }

  /**
   * A statement sent at `sentAt` (`performance.now()`) reached `server`. Another server than the entries' empties
   * the cache: their records may not exist there.
   */
  confirm(server: number, sentAt: number): void {
    if (this.#server !== server) {
      if (this.#server !== undefined) this.clear()
      this.#server = server
      this.#confirmedAt = sentAt
    } else if (sentAt > this.#confirmedAt) this.#confirmedAt = sentAt
  }

  /** Whether the engine should check the server's replication: never checked, checked on another server, or stale. */
  replicationCheckDue(now: number): boolean {
    const last = this.#replication
    return (
      last === undefined ||
      (this.#server !== undefined && last.server !== this.#server) ||
      now - last.checkedAt >= REPLICATION_CHECK_MS ||
      (this.#newestStoredAt >= last.checkedAt && now - last.checkedAt >= REPLICATION_RECHECK_MS)
    )
  }

  /**
   * What a replication check sent at `sentAt` found on `server`: `safe` when no acknowledged commit can be missing
   * from a standby it streams to. An unsafe server empties the cache and keeps it from filling.
   */
  replicationChecked(server: number, safe: boolean, sentAt: number): void {
    this.#replication = { server, safe, checkedAt: sentAt }
    if (!safe) this.clear()
  }

  /** Whether an entry may answer now: the replication of the entries' server was checked and found safe. */
  get #replicationSafe(): boolean {
    return this.#replication?.safe === true && this.#replication.server === this.#server
  }

  /** The number of entries held (expired ones included until touched or evicted). */
  get size(): number {
    return this.#count
  }

  /** The entry of `id`, if there is one. */
  #find(id: RecordId): Entry | undefined {
    for (let entry = this.#entries.get(id.key); entry; entry = entry.sameKey)
      if (entry.scope === id.scope && entry.operation === id.operation) return entry
    return undefined
  }

  /** The finished record, or undefined when unknown or (conservatively) expired. */
  get(id: RecordId): { fingerprint: string; response: StoredResponse } | undefined {
    const entry = this.#find(id)
    // Safe as of a check sent after the entry was stored: its commit was already on every standby the server had
    // then, and a standby attached since was copied from the server after that commit. (A check from before the
    // entry says nothing of a standby that attached in between, asynchronously, and may be promoted.)
    if (!entry || !this.#replicationSafe || entry.storedAt >= this.#replication!.checkedAt) return undefined
    // Not confirmed lately: the database answers (and confirms); the entry stays for when it has.
    if (performance.now() - this.#confirmedAt > this.#maxUnconfirmedMs) return undefined
    if (performance.now() >= entry.monotonicDeadline || Date.now() >= entry.wallDeadline) {
      this.#remove(entry)
      return undefined
    }
    this.#unlink(entry)
    this.#append(entry) // most recently used last
    return {
      fingerprint: entry.fingerprint,
      response: { status: entry.status, headers: entry.headers, body: Buffer.from(entry.body, 'latin1') },
    }
  }

  /**
   * Remembers a finished record read from (or committed on) `server`. `sentAt` is `performance.now()` taken before
   * the statement that measured `expiresInMs` was sent; `sentAtWall` the matching `Date.now()`. A record of another
   * server than the one last confirmed is not kept.
   */
  set(
    id: RecordId,
    fingerprint: string,
    response: StoredResponse,
    expiresInMs: number,
    sentAt: number,
    sentAtWall: number,
    server: number,
  ): void {
    if (!(expiresInMs > 0) || server !== this.#server) return
    // Known unsafe: nothing is kept (entries written while the check is in flight wait for its answer in get()).
    if (this.#replication?.server === server && !this.#replication.safe) return
    const { scope, operation, key } = id
    let bytes = scope.length + operation.length + key.length + fingerprint.length + response.body.length + 64
    for (const name in response.headers) bytes += name.length + (response.headers[name]?.length ?? 0)
    if (bytes > this.#maxBytes) return
    const previous = this.#find(id)
    if (previous) this.#remove(previous)
    const sameKey = this.#entries.get(key)
    let chained = 0
    for (let other = sameKey; other; other = other.sameKey) if (++chained >= MAX_SAME_KEY) return
    const lifetime = Math.min(expiresInMs * CLOCK_RATE_MARGIN, this.#maxAgeMs)
    const entry: Entry = {
      scope,
      operation,
      key,
      sameKey,
      fingerprint,
      status: response.status,
      headers: response.headers,
      body: response.body.toString('latin1'),
      monotonicDeadline: sentAt + lifetime,
      wallDeadline: sentAtWall + lifetime,
      bytes,
      // Stored again (read back from the database): the record was there since the first time.
      storedAt: previous ? previous.storedAt : performance.now(),
      older: undefined,
      newer: undefined,
    }
    this.#entries.set(key, entry)
    this.#count++
    this.#newestStoredAt = entry.storedAt
    this.#append(entry)
    this.#bytes += bytes
    while (this.#oldest && (this.#count > this.#maxEntries || this.#bytes > this.#maxBytes)) {
      this.#remove(this.#oldest)
    }
  }

  /** Forgets every record. */
  clear(): void {
    this.#entries.clear()
    this.#count = 0
    this.#oldest = undefined
    this.#newest = undefined
    this.#bytes = 0
  }

  /** Forgets a record (it was deleted). */
  delete(id: RecordId): void {
    const entry = this.#find(id)
    if (entry) this.#remove(entry)
  }

  #append(entry: Entry): void {
    entry.older = this.#newest
    entry.newer = undefined
    if (this.#newest) this.#newest.newer = entry
    else this.#oldest = entry
    this.#newest = entry
  }

  #unlink(entry: Entry): void {
    if (entry.older) entry.older.newer = entry.newer
    else this.#oldest = entry.newer
    if (entry.newer) entry.newer.older = entry.older
    else this.#newest = entry.older
    entry.older = undefined
    entry.newer = undefined
  }

  #remove(entry: Entry): void {
    this.#unlink(entry)
    const head = this.#entries.get(entry.key)
    if (head === entry) {
      if (entry.sameKey) this.#entries.set(entry.key, entry.sameKey)
      else this.#entries.delete(entry.key)
    } else {
      let before = head
      while (before && before.sameKey !== entry) before = before.sameKey
      if (before) before.sameKey = entry.sameKey
    }
    entry.sameKey = undefined
    this.#count--
    this.#bytes -= entry.bytes
  }
}
