import { randomInt, randomUUID } from 'node:crypto'
import type pg from 'pg'
import {
  hasMethods,
  objectOptions,
  optionalFunction,
  positiveInteger,
  refuseTestingOptions,
} from '../options/check.js'
import { poolOrDatabase } from '../options/datasource.js'
import type { Database } from '../store/database.js'
import { quoteIdent } from '../store/identifiers.js'
import { affected, isDistributed, onEveryShard, SHARD } from '../store/shards.js'
import { outboxNames } from './names.js'
import * as q from './queries.js'
import type { OutboxMessage, Publisher } from './types.js'

/** What a dispatcher reports through `onEvent`. */
export type DispatcherEvent =
  | { type: 'published'; id: string; topic: string; attempt: number }
  | { type: 'failed'; id: string; topic: string; attempt: number; error: unknown; retryInMs: number }
  | { type: 'dead'; id: string; topic: string; attempt: number; error: unknown }
  /** The claim lease ran out before the mark: another dispatcher owns the row now and will publish it again. */
  | { type: 'lease_lost'; id: string }
  | { type: 'error'; error: unknown }
  /**
   * LISTEN never hears its own check notification: the pool goes through a pooler in transaction mode. Sent once;
   * the dispatcher polls from then on. Its message says why and what to configure.
   */
  | { type: 'listen_unavailable'; error: Error }

/** Options of {@link createDispatcher}. */
export interface DispatcherOptions {
  /**
   * A node-postgres pool on the database holding the outbox. The dispatcher holds one of its clients for LISTEN
   * while started. Give `database` instead to dispatch through another library's datasource (it then polls).
   */
  pool?: pg.Pool
  /**
   * The datasource of another database library, instead of `pool`. Nothing wakes the dispatcher at a commit then
   * (LISTEN needs a connection of node-postgres's): it polls every `pollIntervalMs`.
   */
  database?: Database
  /** Where messages go: `jetStreamPublisher()` from `@oncely/server/nats`, `webhookPublisher()`, or your own. */
  publisher: Publisher
  /** @default 'oncely' */
  schema?: string
  /**
   * Rows claimed per round. A round holds at most one message per aggregate key.
   * @default 100
   */
  batchSize?: number
  /**
   * How long a claim is exclusive. Set it well above the publisher's worst-case latency for a whole batch. A started
   * dispatcher whose LISTEN works also holds a session-level advisory lock on that connection and names it in its
   * claims: when its process dies (or that connection closes), Postgres drops the lock and another dispatcher takes
   * the claims over at its next round, without waiting. Otherwise (`listen: false`, a transaction-mode pooler,
   * `dispatchOnce()` without `start()`, an outbox distributed by Citus), a crashed dispatcher's rows stay claimed
   * until the lease runs out. Either way a takeover may publish a message again (delivery is at least once).
   * @default 30_000
   */
  leaseMs?: number
  /**
   * Publish attempts per message (attempts of crashed dispatchers count) before it moves to the `dead` state.
   * @default 10
   */
  maxAttempts?: number
  /**
   * Polling interval when no NOTIFY arrives (NOTIFY wakes the dispatcher at once; polling covers lost
   * notifications, retries that become due, and expired leases).
   * @default 1_000
   */
  pollIntervalMs?: number
  /**
   * Delay before retrying a message whose publish failed, by attempt number.
   * @default (attempt) => Math.min(60_000, 1_000 * 2 ** (attempt - 1))
   */
  retryDelayMs?: (attempt: number) => number
  /**
   * LISTEN for the NOTIFY that `enqueue` sends. Turn off behind a pooler in transaction mode (PgBouncer, RDS
   * Proxy...), where a LISTEN's session goes to other clients and no notification ever arrives; polling alone then
   * delivers. Left on there, the dispatcher finds out by itself: each LISTEN is followed by a NOTIFY of its own,
   * and when that has not arrived within 10 s it reports `listen_unavailable` once and polls from then on.
   * @default true
   * @example
   * createDispatcher({ pool: pgbouncerPool, publisher, listen: false, pollIntervalMs: 250 })
   */
  listen?: boolean
  /**
   * Receives typed events. Must not throw.
   * @default logs `listen_unavailable` with `console.error`, ignores the rest
   */
  onEvent?: (event: DispatcherEvent) => void
}

/** Fault injection for tests (see `@oncely/server/testing`): `afterPublish` runs between the publish and the mark. */
export interface DispatcherHooks {
  afterPublish?: (message: OutboxMessage) => Promise<void> | void
}

/** A running (or runnable) outbox dispatcher. Any number may run at once, in one process or many. */
export interface Dispatcher {
  /** Starts the loop: LISTEN, then claim and publish until stopped. */
  start(): void
  /** Stops after the current round and releases the LISTEN client. */
  stop(): Promise<void>
  /** Claims and publishes one batch; resolves with the number of rows claimed. For tests, scripts and cron. */
  dispatchOnce(): Promise<number>
  /** Deletes published rows older than `olderThanMs` (default 7 days) in bounded batches; returns how many. */
  purgePublished(options?: { olderThanMs?: number; batchSize?: number; maxBatches?: number }): Promise<number>
  /** Moves dead-lettered rows back to pending with a fresh attempt budget; returns how many. */
  requeueDead(ids: readonly string[]): Promise<number>
}

const defaultRetryDelay = (attempt: number) => Math.min(60_000, 1_000 * 2 ** (attempt - 1))

/** How long a LISTEN may take to hear its own check notification before the dispatcher gives up on it. */
const LISTEN_CHECK_MS = 10_000
/** The payload of that check, told apart from `enqueue`'s (empty) notifications. */
const LISTEN_CHECK = 'oncely:listen-check:'

function describe(error: unknown): string {
  return (error instanceof Error ? `${error.name}: ${error.message}` : String(error)).slice(0, 2_000)
}

/**
 * Creates an outbox dispatcher: claims due rows with `FOR UPDATE SKIP LOCKED` under a lease, publishes them, marks
 * them published (fenced by the claim token), retries failures with backoff and dead-letters poison messages.
 * Delivery is at least once: a crash between publish and mark publishes again, with the same `message.id`. On an
 * outbox distributed by Citus (`distribute()`), it claims tenant by tenant (a statement on each tenant's shard), and
 * a message's order holds among the messages of its aggregate within its tenant (`enqueue`'s `scope`).
 *
 * @example
 * const dispatcher = createDispatcher({ pool, publisher: jetStreamPublisher({ js }) })
 * dispatcher.start()
 * process.on('SIGTERM', () => dispatcher.stop())
 */
export function createDispatcher(options: DispatcherOptions): Dispatcher {
  refuseTestingOptions('createDispatcher()', options, ['hooks'], 'createDispatcherForTesting()')
  return buildDispatcher(options, {})
}

/** {@link createDispatcher} with fault injection (see `@oncely/server/testing`). */
export function buildDispatcher(options: DispatcherOptions, hooks: DispatcherHooks): Dispatcher {
  objectOptions('createDispatcher()', options)
  const { pool, publisher } = options
  const database = poolOrDatabase('createDispatcher()', options)
  hasMethods('publisher', publisher, ['publish'], 'a publisher, with a `publish(message)` method')
  const { table, channel } = outboxNames(options.schema)
  const batchSize = positiveInteger('batchSize', options.batchSize ?? 100)
  const leaseMs = positiveInteger('leaseMs', options.leaseMs ?? 30_000)
  const maxAttempts = positiveInteger('maxAttempts', options.maxAttempts ?? 10)
  const pollIntervalMs = positiveInteger('pollIntervalMs', options.pollIntervalMs ?? 1_000)
  const retryDelayMs = optionalFunction('retryDelayMs', options.retryDelayMs) ?? defaultRetryDelay
  const onEvent =
    optionalFunction('onEvent', options.onEvent) ??
    ((event: DispatcherEvent) => {
      if (event.type === 'listen_unavailable') console.error(event.error.message)
    })
  const emit = (event: DispatcherEvent) => {
    try {
      onEvent(event)
    } catch {
      // An observer must not stop the dispatcher.
    }
  }

  async function deliver(row: q.ClaimRow, token: string): Promise<void> {
    const message: OutboxMessage = {
      id: row.id,
      topic: row.topic,
      payload: row.payload,
      headers: row.headers,
      aggregateKey: row.aggregate_key,
      attempt: row.attempts,
      createdAt: row.created_at,
    }
    try {
      await publisher.publish(message)
    } catch (error) {
      const delay = Math.max(0, Math.floor(retryDelayMs(row.attempts)))
      const failed = await database.query<{ status: string }>(
        q.markFailed(table, row, token, describe(error), delay, maxAttempts),
      )
      const status = failed.rows[0]?.status
      if (status === 'dead')
        emit({ type: 'dead', id: row.id, topic: row.topic, attempt: row.attempts, error })
      else if (status === 'pending') {
        emit({ type: 'failed', id: row.id, topic: row.topic, attempt: row.attempts, error, retryInMs: delay })
      } else emit({ type: 'lease_lost', id: row.id })
      return
    }
    await hooks.afterPublish?.(message)
    const marked = await database.query(q.markPublished(table, row, token))
    if (marked.rowCount === 1)
      emit({ type: 'published', id: row.id, topic: row.topic, attempt: row.attempts })
    else emit({ type: 'lease_lost', id: row.id })
  }

  /** Buries exhausted rows and claims a batch: in one statement each, or tenant by tenant on a distributed outbox. */
  async function claimBatch(token: string): Promise<q.ClaimRow[]> {
    if (!(await isDistributed(database, table))) {
      await database.query(q.buryExhausted(table, maxAttempts))
      return (await database.query<q.ClaimRow>(q.claim(table, token, batchSize, leaseMs, presence ?? null)))
        .rows
    }
    const tenants = await database.query<{ scope: string }>(q.tenantsDue(table, maxAttempts, batchSize))
    const rows: q.ClaimRow[] = []
    for (const { scope } of tenants.rows) {
      if (rows.length >= batchSize) break
      await database.query(q.buryExhausted(table, maxAttempts, scope))
      const claimed = await database.query<q.ClaimRow>(
        q.claim(table, token, batchSize - rows.length, leaseMs, null, scope),
      )
      rows.push(...claimed.rows)
    }
    return rows
  }

  async function dispatchOnce(): Promise<number> {
    const token = randomUUID()
    const rows = await claimBatch(token)
    rows.sort((a, b) => Number(BigInt(a.seq) - BigInt(b.seq)))
    const results = await Promise.allSettled(rows.map((row) => deliver(row, token)))
    for (const result of results)
      if (result.status === 'rejected') emit({ type: 'error', error: result.reason })
    return rows.length
  }

  let running = false
  let loop: Promise<void> | undefined
  let listener: pg.PoolClient | undefined
  let releaseListener: (() => Promise<void>) | undefined
  let notified = false
  let wake: (() => void) | undefined
  // The check of the current LISTEN: its payload, and the timer that gives up on it.
  let check: { payload: string; timer: NodeJS.Timeout } | undefined
  // The check notification in flight, if any (awaited by stop()).
  let checkSent: Promise<void> | undefined
  // Set once a LISTEN heard nothing: never listened again.
  let deaf = false
  // The second key of the presence lock the LISTEN connection holds (queries.ts, PRESENCE_CLASS), once taken: claims
  // record it, so that when this process dies another dispatcher takes them over at once, not after `leaseMs`.
  let presence: number | undefined
  // The presence lock being taken, if it is (awaited by stop(), which lets go of it).
  let presenceTaken: Promise<void> | undefined
  const onNotification = (message: pg.Notification) => {
    if (check && message.payload === check.payload) {
      clearTimeout(check.timer)
      check = undefined
      // The LISTEN heard its own check: the connection is a session of its own, not a pooler's, so a lock taken on
      // it lasts exactly as long as this dispatcher's connection does.
      if (listener) presenceTaken = takePresence(listener)
    }
    notified = true
    wake?.()
  }

  /** Takes a presence lock on the LISTEN connection, under a random key not held by another dispatcher. */
  async function takePresence(client: pg.PoolClient): Promise<void> {
    try {
      for (let tries = 0; tries < 5 && presence === undefined && listener === client; tries++) {
        const id = randomInt(1, 2 ** 31)
        const taken = await client.query<{ taken: boolean }>(
          'SELECT pg_try_advisory_lock($1::int4, $2::int4) AS taken',
          [q.PRESENCE_CLASS, id],
        )
        if (taken.rows[0]?.taken && listener === client) presence = id
      }
    } catch (error) {
      // Without it, claims are freed by their lease alone, as before.
      if (running) emit({ type: 'error', error })
    }
  }

  async function giveUpListening(): Promise<void> {
    deaf = true
    check = undefined
    const release = releaseListener
    listener = undefined
    releaseListener = undefined
    emit({
      type: 'listen_unavailable',
      error: new Error(
        `The outbox dispatcher's LISTEN did not hear its own NOTIFY within ${LISTEN_CHECK_MS / 1000} s: its pool goes through a pooler in transaction mode (PgBouncer, RDS Proxy...), which hands a LISTEN's connection to other clients, so no notification ever arrives. It polls every ${pollIntervalMs} ms from now on; set createDispatcher({ listen: false }) to make that the configuration (and pollIntervalMs to the delay you accept), or give it a pool with connections of its own (session mode) to be woken at each commit.`,
      ),
    })
    await release?.()
  }

  /** Sends the LISTEN's check notification from another connection, and gives up on it if it never arrives. */
  function checkListening(client: pg.PoolClient): void {
    const payload = `${LISTEN_CHECK}${randomUUID()}`
    const timer = setTimeout(() => {
      if (listener === client && check?.payload === payload) void giveUpListening()
    }, LISTEN_CHECK_MS)
    timer.unref?.()
    check = { payload, timer }
    // Awaited by stop(), so a stopped dispatcher has no query left in flight (nor an error to report after it).
    checkSent = database.query({ text: 'SELECT pg_notify($1, $2)', values: [channel, payload] }).then(
      () => {},
      (error: unknown) => {
        // Not sent, so nothing can be concluded: the next LISTEN checks again.
        clearTimeout(timer)
        if (check?.payload === payload) check = undefined
        if (running) emit({ type: 'error', error })
      },
    )
  }

  async function ensureListening(): Promise<void> {
    if (options.listen === false || deaf || listener || pool === undefined) return
    const client = await pool.connect()
    // Attached only while the dispatcher holds the client: once released, its errors are the pool's.
    const onError = (error: Error) => {
      emit({ type: 'error', error })
      if (listener === client) {
        listener = undefined
        presence = undefined
      }
      client.off('notification', onNotification)
      client.off('error', onError)
      client.release(error)
    }
    try {
      await client.query(`LISTEN ${quoteIdent(channel)}`)
    } catch (error) {
      client.release(error as Error)
      throw error
    }
    client.on('notification', onNotification)
    client.on('error', onError)
    listener = client
    checkListening(client)
    releaseListener = async () => {
      client.off('notification', onNotification)
      let broken: Error | undefined
      await presenceTaken
      presenceTaken = undefined
      // No claim of this dispatcher is in flight any more (stop() waited for the round), so the lock can go first.
      const unlock =
        presence === undefined ? '' : `SELECT pg_advisory_unlock(${q.PRESENCE_CLASS}, ${presence}); `
      presence = undefined
      await client.query(`${unlock}UNLISTEN ${quoteIdent(channel)}`).catch((error: Error) => {
        broken = error
      })
      client.off('error', onError)
      client.release(broken)
    }
  }

  async function idle(): Promise<void> {
    if (notified || !running) return
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, pollIntervalMs)
      wake = () => {
        clearTimeout(timer)
        resolve()
      }
    })
    wake = undefined
  }

  async function run(): Promise<void> {
    while (running) {
      try {
        await ensureListening()
        notified = false
        const claimed = await dispatchOnce()
        if (claimed > 0) continue
      } catch (error) {
        emit({ type: 'error', error })
        notified = false
      }
      await idle()
    }
  }

  return {
    start() {
      if (running) return
      running = true
      loop = run()
    },
    async stop() {
      running = false
      if (check) clearTimeout(check.timer)
      check = undefined
      wake?.()
      await loop
      await checkSent
      loop = undefined
      const release = listener ? releaseListener : undefined
      listener = undefined
      releaseListener = undefined
      await release?.()
    },
    dispatchOnce,
    async purgePublished(purge = {}) {
      const olderThanMs = positiveInteger('olderThanMs', purge.olderThanMs ?? 7 * 86_400_000)
      const size = positiveInteger('batchSize', purge.batchSize ?? 1_000)
      const maxBatches = positiveInteger('maxBatches', purge.maxBatches ?? 100)
      let total = 0
      const distributed = await isDistributed(database, table)
      for (let batch = 0; batch < maxBatches; batch++) {
        const deleted = distributed
          ? (
              await onEveryShard(database, table, q.purgeText(SHARD, String(olderThanMs), String(size)))
            ).reduce((sum, tag) => sum + affected(tag), 0)
          : ((await database.query(q.purgePublished(table, olderThanMs, size))).rowCount ?? 0)
        total += deleted
        if (deleted < size) break
      }
      return total
    },
    async requeueDead(ids) {
      return (await database.query(q.requeueDead(table, ids))).rowCount
    },
  }
}
