import type pg from 'pg'
import type { ResponseTooLargeError } from '../errors.js'
import type { PostgresStore } from '../store/postgres-store.js'
import type { ReplayCacheOptions } from './replay-cache.js'

/** A response as the engine stores and replays it. */
export interface StoredResponse {
  /** HTTP status code (or an equivalent outcome code for non-HTTP adapters). */
  status: number
  /** Response headers, lower-case names; only the replay allowlist is stored. */
  headers: Record<string, string>
  /** The exact body bytes. */
  body: Buffer
}

/** What a handler returns. Objects and arrays are stored as JSON (`application/json`), strings as UTF-8. */
export interface HandlerResponse {
  /** @default 200 */
  status?: number
  headers?: Record<string, string | number | readonly string[] | undefined>
  body?: Buffer | Uint8Array | string | object | null
}

/** What the handler receives. `Tx` is the transaction type of the store's datasource (`pg.PoolClient` by default). */
export interface ExecutionContext<Tx = pg.PoolClient> {
  /**
   * The open transaction that will also complete the key record, as your database library types it (a
   * `pg.PoolClient` for a node-postgres pool, a Drizzle transaction, a Kysely `Transaction`...). Do every business
   * write through it; do not commit or roll it back yourself.
   */
  tx: Tx
  scope: string
  operation: string
  key: string
  /**
   * 1 for the first execution of this key, then 2, 3, ... after a retryable failure or a takeover. Under
   * `reservation: 'lock'` it counts attempts that left a record: one that failed before saving a recovery point
   * left none, so the next is numbered the same.
   */
  attempt: number
  /** The last point saved with {@link ExecutionContext.saveRecoveryPoint} by an earlier attempt, else `null`. */
  recoveryPoint: string | null
  /**
   * Saves a recovery point, committed at once and outside the business transaction, so a later attempt knows how
   * far an earlier one got (for example past an external call). Resolves `false` when this attempt was fenced out.
   * It is written on the store's side lane (at most two connections of its own, opened like the pool's), never on
   * a second connection of the pool: an attempt already holds one of those.
   * Under `reservation: 'lock'`, the first save also writes the key's row as `in_progress` under a lease, so from
   * then on a crash leaves the key held until the lease runs out (the next attempt then takes over with the point),
   * as under `'row'`.
   * With `tx` (a transaction of your own on the same datasource, not `ctx.tx`), the save runs in it and commits or
   * rolls back with that transaction's writes: an atomic phase (see `@oncely/server/steps`).
   */
  saveRecoveryPoint(point: string, tx?: Tx): Promise<boolean>
  /**
   * A deterministic key for one external call of this execution: SHA-256 (hex) of scope, operation, key and step.
   * Send it as the provider's idempotency key so a retry after a crash cannot charge twice.
   *
   * @example
   * await stripe.charges.create(params, { idempotencyKey: ctx.stepKey('charge') })
   */
  stepKey(step: string): string
  /** Aborted when the engine gives up on this attempt (the transaction broke, or the attempt was abandoned). */
  signal: AbortSignal
}

/** How a thrown error is treated. */
export type ErrorClass = 'retryable' | 'permanent'

/** Names one key record. */
export interface KeyId {
  /** Who the key belongs to (a tenant or user id, from authentication). */
  scope: string
  /** What is being done, such as `POST /v1/payments`. */
  operation: string
  /** The client's idempotency key. */
  key: string
}

/** One idempotent execution. */
export interface ExecuteInput<Tx = pg.PoolClient> {
  /** Who the key belongs to (a tenant or user id, from authentication, never from a client header). */
  scope: string
  /** What is being done, such as `POST /v1/payments`. The same key on two operations is two records. */
  operation: string
  /** The client's idempotency key. */
  key: string
  /** SHA-256 hex of the request, from `requestFingerprint()`. Reusing the key with another fingerprint is a mismatch. */
  fingerprint: string
  /** The work. Runs at most once per successful key, inside the transaction in `ctx.tx`. */
  handler: (ctx: ExecutionContext<Tx>) => Promise<HandlerResponse>
  /**
   * Classifies an error thrown by the handler. Retryable errors release the key (nothing stored); permanent ones
   * are stored as the response from `renderError` and replayed.
   * @default defaultClassify: an HTTP 4xx `statusCode`/`status` is permanent, except 408, 409, 425 and 429 and any
   * error carrying a `Retry-After` header; everything else is retryable
   */
  classify?: (error: unknown) => ErrorClass
  /**
   * Renders a permanent error as the response to store and replay.
   * @default a JSON body `{ statusCode, code, error, message }` with the error's 4xx status
   */
  renderError?: (error: unknown) => HandlerResponse
  /** Wait (bounded) for an in-flight first attempt to finish and return its result instead of `in_progress`. */
  wait?: { timeoutMs: number }
  /**
   * Run the handler anyway (in a plain transaction, without a key record) when the store is unavailable. Only for
   * operations that are naturally idempotent.
   * @default false
   */
  failOpen?: boolean
  /** Overrides the engine's `leaseMs` for this execution. */
  leaseMs?: number
  /** Overrides the engine's `retentionMs` for this execution. */
  retentionMs?: number
  /** Request headers to store with the record (an allowlist the caller already applied). Never credentials. */
  requestHeaders?: Record<string, string>
}

/** The result of {@link Engine.execute}. */
export type Outcome =
  | {
      kind: 'executed'
      response: StoredResponse
      /** `failed_permanent` when a permanent error was stored. */
      status: 'succeeded' | 'failed_permanent'
      attempt: number
      /** True when the store was down and the handler ran without a key record (`failOpen`). */
      failedOpen?: boolean
      /**
       * Set when the handler's response exceeded `maxResponseBytes`: its writes were rolled back, and `response` is
       * the `response_too_large` problem stored in its place (a retry replays it rather than running the handler
       * again, whose external effects may have happened). Raise `maxResponseBytes`, then `engine.forget()` the key.
       */
      tooLarge?: ResponseTooLargeError
    }
  | {
      kind: 'replayed'
      response: StoredResponse
      /** True when this attempt executed, was fenced out by a takeover, and answers with the winner's response. */
      fencedOut: boolean
    }
  | {
      kind: 'in_progress'
      /** An estimate of when the attempt holding the key will be done (at least a second). */
      retryAfterMs: number
    }
  | { kind: 'mismatch' }
  | { kind: 'unavailable'; retryAfterMs: number; error: unknown }
  | {
      /**
       * This attempt lost the key before it finished: its transaction sat idle past `leaseMs` (Postgres ended it),
       * or its lease in the key's row ran out and another attempt took the key over. Nothing it wrote committed;
       * retrying with the same key is safe. A live process renews its lease while the handler runs, so this means
       * the process stalled (paused, its event loop blocked, starved of CPU) for longer than `leaseMs`.
       */
      kind: 'lease_expired'
      retryAfterMs: number
      attempt: number
      /** The lease the attempt had. */
      leaseMs: number
    }
  | {
      kind: 'retryable_failure'
      /**
       * Why: the handler threw a retryable error, answered 5xx, or answered with a status a client retries (408,
       * 409, 425, 429) or a `Retry-After` header.
       */
      reason: 'error' | 'server_error_response' | 'retryable_response'
      /** The thrown error (for `error`). */
      error?: unknown
      /** The handler's response, sent to the client but not stored (for the two `_response` reasons). */
      response?: StoredResponse
    }

interface EventBase {
  scope: string
  operation: string
  key: string
}

/** Everything the engine reports through `onEvent`. Never carries request or response bodies. */
export type EngineEvent =
  | (EventBase & { type: 'reserved'; attempt: number })
  | (EventBase & { type: 'executed'; attempt: number; status: number; durationMs: number })
  | (EventBase & { type: 'replayed'; status: number })
  | (EventBase & { type: 'in_progress'; retryAfterMs: number })
  | (EventBase & { type: 'mismatch' })
  | (EventBase & { type: 'takeover'; attempt: number })
  | (EventBase & { type: 'fenced_out'; attempt: number })
  | (EventBase & { type: 'lease_expired'; attempt: number; leaseMs: number })
  | (EventBase & { type: 'expired' })
  | (EventBase & { type: 'released'; attempt: number; reason: string })
  | { type: 'store_error'; error: unknown; scope?: string; operation?: string; key?: string }

/** Options of {@link createEngine}. */
export interface EngineOptions<Tx = pg.PoolClient> {
  /** Where key records live: `postgresStore({ pool })`. */
  store: PostgresStore<Tx>
  /**
   * How long an attempt keeps its key once its process stops making progress. While the handler runs, the engine
   * renews the lease every `leaseMs / 3` from the event loop (a keep-alive statement on the business transaction,
   * and under `'row'` or after a recovery point a renewed deadline in the key's row), so a live handler keeps its
   * key however long it waits on a provider. A process that stops (paused, its event loop blocked, starved of CPU)
   * renews nothing: Postgres ends its transaction once it sat idle this long, and under `'row'` the next attempt
   * takes over once the lease in the row ran out (the earlier one can then no longer complete: it is fenced). Set
   * it above the longest stall you tolerate before a takeover.
   * @default 30_000
   */
  leaseMs?: number
  /**
   * How long a finished key is kept and replayed (`expires_at = now() + retentionMs`); an expired key is new again.
   * Must exceed `leaseMs`. Tell clients, so they stop retrying a key before the server forgets it.
   * @default 86_400_000 (24 hours)
   */
  retentionMs?: number
  /**
   * Largest response body stored for replay, in bytes. A larger response fails at completion time (business writes
   * rolled back, key released), never silently truncated.
   * @default 1_048_576
   */
  maxResponseBytes?: number
  /**
   * Response headers stored and replayed (lower-case). `set-cookie`, credentials and hop-by-hop headers are refused.
   * @default DEFAULT_REPLAY_HEADERS: content-type, content-language, content-location, content-disposition, location,
   * etag, last-modified, cache-control, expires, link, vary
   */
  replayHeaders?: readonly string[]
  /**
   * `Retry-After` advised when the store is unavailable.
   * @default 1_000
   */
  unavailableRetryAfterMs?: number
  /**
   * An in-process LRU of finished responses (succeeded or failed_permanent), so a replay or a 422 on a key this
   * process has seen costs no database round trip. Safe with many instances: a finished record cannot change until
   * it expires, and an entry is evicted conservatively before the record's `expires_at` (its remaining lifetime is
   * measured by the database and counted from before the statement was sent, minus 0.1% for clock drift). A record
   * deleted with `engine.forget()` leaves this process's cache at once; one deleted or edited by hand (or forgotten
   * through another instance) is answered from an entry for at most `maxAgeMs`. A failover to a standby that missed
   * commits (asynchronous replication), or a restore, can lose a finished record. So the cache answers only while
   * the server says no commit it acknowledged can be missing on a standby: it streams to none, or its commits wait
   * for synchronous standbys (checked when the engine reaches a server, every 10 s, and within 100 ms of a new
   * entry, which answers only after a check sent after it); with an asynchronous standby it stays empty and says so
   * once on `console.warn`. And every engine statement tells which server it
   * reached: another server (a restore, a restart) empties the cache, and an entry answers only within
   * `maxUnconfirmedMs` of the last statement that reached its server.
   * @default { maxEntries: 10_000, maxBytes: 16_777_216, maxAgeMs: 60_000, maxUnconfirmedMs: 1_000 }
   * @example
   * createEngine({ store, replayCache: { maxEntries: 50_000, maxBytes: 64 * 1024 * 1024, maxAgeMs: 10_000 } })
   */
  replayCache?: ReplayCacheOptions | false
  /**
   * How a new key is reserved. Both protocols give the same guarantees (one execution per key, the record committed
   * with the business writes, a fenced completion, replay, 422 before 409); they differ in what a request costs and
   * in what an attempt in flight leaves behind.
   *
   * - `'row'`: the key row is committed as `in_progress` (with a lease) before the business transaction, and
   *   completed in it, fenced on a lock token. Duplicates get 409 with the remaining lease as `Retry-After`; an
   *   attempt that stalls or crashes holds the key until its lease runs out, then the next attempt takes over and
   *   the earlier one can no longer commit. Two commits per new key, one of them without a WAL flush.
   * - `'lock'`: a transaction-scoped advisory lock on the key, taken in the business transaction's first round
   *   trip, and the finished record written by one fenced upsert sent with the `COMMIT`: one commit and three
   *   round trips per new key, like the bare transaction. Duplicates get 409 (`Retry-After` one second). A crash
   *   frees the key at once; an attempt that stops while alive loses it once its transaction sat idle for `leaseMs`
   *   (Postgres ends it). Nothing is written for the key before the commit, except by `saveRecoveryPoint`, whose
   *   first call writes the row protocol's leased row; `ctx.attempt` counts only attempts that left a record.
   *
   * Under both, the business transaction may sit idle (between statements) for at most `leaseMs`: Postgres then ends
   * it (`idle_in_transaction_session_timeout`), so an attempt that stopped cannot keep locks or commit late. Both
   * protocols can share a table (during a switch from one to the other): each fences against the other's writes.
   * @default 'lock'
   * @example
   * createEngine({ store, reservation: 'row' }) // in_progress rows and the remaining lease as Retry-After
   */
  reservation?: 'row' | 'lock'
  /** Receives typed events (reserved, executed, replayed, in_progress, mismatch, takeover, ...). Must not throw. */
  onEvent?: (event: EngineEvent) => void
}

/** Options of {@link Engine.reap}. */
export interface ReapOptions {
  /**
   * Rows deleted per statement. On a key table distributed by Citus (`distribute()`), the statement runs on every
   * shard at once, and each deletes up to this many.
   * @default 1_000
   */
  batchSize?: number
  /** Stop after this many batches in one call. @default 100 */
  maxBatches?: number
}

/** Options of {@link Engine.startReaper}. */
export interface ReaperOptions extends ReapOptions {
  /** Time between sweeps. @default 60_000 */
  intervalMs?: number
}

/** The transport-agnostic idempotency engine. */
export interface Engine<Tx = pg.PoolClient> {
  /** Runs `input.handler` at most once per (scope, operation, key), or answers from the record. Never throws for store errors. */
  execute(input: ExecuteInput<Tx>): Promise<Outcome>
  /**
   * What `execute` would answer for this request right now, without running anything or reserving the key:
   * `replayed` or `mismatch` for a finished record, `mismatch` or `in_progress` while another attempt holds the key,
   * `unavailable` when the store fails, and `null` when the key is free (an `execute` would run the handler). Emits
   * the events `execute` would for the same answer.
   *
   * @example
   * const outcome = await engine.peek({ scope, operation: 'POST /v1/payments', key, fingerprint })
   * if (outcome?.kind === 'replayed') return outcome.response // finished: answer without touching the handler
   */
  peek(input: Pick<ExecuteInput, 'scope' | 'operation' | 'key' | 'fingerprint'>): Promise<Outcome | null>
  /**
   * Deletes a key record whatever its state, so the key is new again: the next request with it runs the handler.
   * For operators (to let a customer retry after a fix). This process forgets it at once; other instances answer
   * from their replay cache for at most `replayCache.maxAgeMs`. Resolves whether a record was deleted; rejects when
   * the store fails. An attempt running under the key when it is forgotten is fenced out and rolled back.
   *
   * @example
   * await engine.forget({ scope: 'tenant_1', operation: 'POST /v1/payments', key: 'order-17' })
   */
  forget(id: KeyId): Promise<boolean>
  /** Deletes expired rows in bounded batches; returns how many. Safe with several instances at once. */
  reap(options?: ReapOptions): Promise<number>
  /** Starts a periodic `reap()`; call the returned function to stop it. The timer does not keep the process alive. */
  startReaper(options?: ReaperOptions): () => void
  /**
   * Checks that the store's table exists and is up to date, so a missing migration fails at start-up instead of
   * answering every request 503. Rejects with a `StoreSetupError` that names the table and the fix; with the
   * database's own error when Postgres cannot be reached. The HTTP adapters call it when the server starts.
   *
   * @example
   * await engine.verify() // StoreSetupError: The idempotency table "oncely"."idempotency_keys" does not exist. Run `await migrate(pool)` ...
   */
  verify(): Promise<void>
  /** The resolved options. */
  readonly options: Readonly<
    Required<Pick<EngineOptions, 'leaseMs' | 'retentionMs' | 'maxResponseBytes' | 'reservation'>>
  >
}
