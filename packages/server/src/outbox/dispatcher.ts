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
import { Listener, type ListenerOptions } from './listener.js'
import { outboxNames } from './names.js'
import { dispatchOnce, type Outbox, purgePublished, requeueDead } from './rounds.js'
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
  const dispatcher = new OutboxDispatcher(
    { database, table, publisher, batchSize, leaseMs, maxAttempts, retryDelayMs, hooks, emit },
    { pool, database, channel, enabled: options.listen !== false, pollIntervalMs, emit },
  )
  // Methods that need no `this`, as before: `process.on('SIGTERM', dispatcher.stop)` stops it.
  return {
    start: () => dispatcher.start(),
    stop: () => dispatcher.stop(),
    dispatchOnce: () => dispatcher.dispatchOnce(),
    purgePublished: (purge) => dispatcher.purgePublished(purge),
    requeueDead: (ids) => dispatcher.requeueDead(ids),
  }
}

/**
 * A dispatcher's state: the run loop of `start()` (a round, then, when it claimed nothing, an idle until the next
 * poll or a NOTIFY) and its {@link Listener}, which the rounds' claims name by its presence lock.
 */
class OutboxDispatcher implements Dispatcher {
  readonly #outbox: Outbox
  readonly #listener: Listener
  readonly #pollIntervalMs: number
  #running = false
  #loop: Promise<void> | undefined
  // A notification arrived since the current round began: the next round starts without idling.
  #notified = false
  // Ends the idle in progress, if any (a notification, or stop()).
  #wake: (() => void) | undefined

  constructor(outbox: Omit<Outbox, 'presence'>, listen: Omit<ListenerOptions, 'running' | 'onWake'>) {
    this.#pollIntervalMs = listen.pollIntervalMs
    this.#listener = new Listener({
      ...listen,
      running: () => this.#running,
      onWake: () => {
        this.#notified = true
        this.#wake?.()
      },
    })
    this.#outbox = { ...outbox, presence: () => this.#listener.presence }
  }

  start(): void {
    if (this.#running) return
    this.#running = true
    this.#loop = this.#run()
  }

  async stop(): Promise<void> {
    this.#running = false
    // A stopping dispatcher must not give up on its LISTEN (and report `listen_unavailable`) while it waits.
    this.#listener.stopChecking()
    this.#wake?.()
    // The round in progress ends first: no claim naming the presence lock is in flight when close() lets go of it.
    await this.#loop
    // Nor is the check notification: a stopped dispatcher has no query left in flight (nor an error to report).
    await this.#listener.checkSent
    this.#loop = undefined
    await this.#listener.close()
  }

  dispatchOnce(): Promise<number> {
    return dispatchOnce(this.#outbox)
  }

  purgePublished(purge?: { olderThanMs?: number; batchSize?: number; maxBatches?: number }): Promise<number> {
    return purgePublished(this.#outbox, purge)
  }

  requeueDead(ids: readonly string[]): Promise<number> {
    return requeueDead(this.#outbox, ids)
  }

  async #run(): Promise<void> {
    while (this.#running) {
      try {
        await this.#listener.ensure()
        this.#notified = false
        const claimed = await dispatchOnce(this.#outbox)
        if (claimed > 0) continue
      } catch (error) {
        this.#outbox.emit({ type: 'error', error })
        this.#notified = false
      }
      await this.#idle()
    }
  }

  async #idle(): Promise<void> {
    if (this.#notified || !this.#running) return
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, this.#pollIntervalMs)
      this.#wake = () => {
        clearTimeout(timer)
        resolve()
      }
    })
    this.#wake = undefined
  }
}
