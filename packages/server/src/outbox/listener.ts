import { randomInt, randomUUID } from 'node:crypto'
import type pg from 'pg'
import type { Database } from '../store/database.js'
import { quoteIdent } from '../store/identifiers.js'
import type { DispatcherEvent } from './dispatcher.js'
import * as q from './queries.js'

/** How long a LISTEN may take to hear its own check notification before the dispatcher gives up on it. */
const LISTEN_CHECK_MS = 10_000
/** The payload of that check, told apart from `enqueue`'s (empty) notifications. */
const LISTEN_CHECK = 'oncely:listen-check:'

/** What a {@link Listener} is given by its dispatcher. */
export interface ListenerOptions {
  /** The pool a LISTEN client is taken from; without one (a datasource of another library) nothing is listened to. */
  pool: pg.Pool | undefined
  /** Where the check notification is sent from: another connection than the LISTEN's. */
  database: Database
  channel: string
  /** False for `listen: false`: never listens. */
  enabled: boolean
  /** Named in the `listen_unavailable` message. */
  pollIntervalMs: number
  emit: (event: DispatcherEvent) => void
  /** Whether the dispatcher is started: once it is stopping, a failed check or presence lock is not reported. */
  running: () => boolean
  /** Called at every notification on the channel (`enqueue`'s and the check's). */
  onWake: () => void
}

/**
 * The LISTEN side of a started dispatcher: a pool client that LISTENs on the outbox channel, the check notification
 * that finds out whether that client is a session of its own (a transaction-mode pooler hands it to other clients,
 * so nothing would ever arrive), and the presence lock taken on it once it is.
 */
export class Listener {
  readonly #options: ListenerOptions
  #client: pg.PoolClient | undefined
  #release: (() => Promise<void>) | undefined
  // The check of the current LISTEN: its payload, and the timer that gives up on it.
  #check: { payload: string; timer: NodeJS.Timeout } | undefined
  // The check notification in flight, if any (awaited by the dispatcher's stop()).
  #checkSent: Promise<void> | undefined
  // Set once a LISTEN heard nothing: never listened again.
  #deaf = false
  // The second key of the presence lock the LISTEN connection holds (queries.ts, PRESENCE_CLASS), once taken: claims
  // record it, so that when this process dies another dispatcher takes them over at once, not after `leaseMs`.
  #presence: number | undefined
  // The presence lock being taken, if it is (awaited by close(), which lets go of it).
  #presenceTaken: Promise<void> | undefined

  constructor(options: ListenerOptions) {
    this.#options = options
  }

  /** The key of the presence lock the LISTEN connection holds, for claims to record; undefined while none is. */
  get presence(): number | undefined {
    return this.#presence
  }

  /** The check notification in flight, if any: a stopped dispatcher has no query left in flight. */
  get checkSent(): Promise<void> | undefined {
    return this.#checkSent
  }

  /** LISTENs on a client of the pool, unless it already does or must not (`listen: false`, deaf, no pool). */
  async ensure(): Promise<void> {
    const { enabled, pool, channel } = this.#options
    if (!enabled || this.#deaf || this.#client || pool === undefined) return
    const client = await pool.connect()
    const onError = this.#errorHandler(client)
    try {
      await client.query(`LISTEN ${quoteIdent(channel)}`)
    } catch (error) {
      client.release(error as Error)
      throw error
    }
    client.on('notification', this.#onNotification)
    client.on('error', onError)
    this.#client = client
    this.#sendCheck(client)
    this.#release = this.#releaser(client, onError)
  }

  /** Forgets the check of the current LISTEN, so that a stopping dispatcher does not give up on it. */
  stopChecking(): void {
    if (this.#check) clearTimeout(this.#check.timer)
    this.#check = undefined
  }

  /** Lets go of the LISTEN client and its presence lock (after the dispatcher's last round). */
  async close(): Promise<void> {
    const release = this.#client ? this.#release : undefined
    this.#client = undefined
    this.#release = undefined
    await release?.()
  }

  readonly #onNotification = (message: pg.Notification): void => {
    if (this.#check && message.payload === this.#check.payload) {
      clearTimeout(this.#check.timer)
      this.#check = undefined
      // The LISTEN heard its own check: the connection is a session of its own, not a pooler's, so a lock taken on
      // it lasts exactly as long as this dispatcher's connection does.
      if (this.#client) this.#presenceTaken = this.#takePresence(this.#client)
    }
    this.#options.onWake()
  }

  /** What to do when the LISTEN client fails: report it, forget it and hand it back to the pool as broken. */
  #errorHandler(client: pg.PoolClient): (error: Error) => void {
    // Attached only while the dispatcher holds the client: once released, its errors are the pool's.
    const onError = (error: Error) => {
      this.#options.emit({ type: 'error', error })
      if (this.#client === client) {
        this.#client = undefined
        this.#presence = undefined
      }
      client.off('notification', this.#onNotification)
      client.off('error', onError)
      client.release(error)
    }
    return onError
  }

  /** Lets go of the presence lock, UNLISTENs and releases `client`. */
  #releaser(client: pg.PoolClient, onError: (error: Error) => void): () => Promise<void> {
    return async () => {
      client.off('notification', this.#onNotification)
      let broken: Error | undefined
      await this.#presenceTaken
      this.#presenceTaken = undefined
      // No claim of this dispatcher is in flight any more (stop() waited for the round), so the lock can go first.
      const unlock =
        this.#presence === undefined
          ? ''
          : `SELECT pg_advisory_unlock(${q.PRESENCE_CLASS}, ${this.#presence}); `
      this.#presence = undefined
      await client.query(`${unlock}UNLISTEN ${quoteIdent(this.#options.channel)}`).catch((error: Error) => {
        broken = error
      })
      client.off('error', onError)
      client.release(broken)
    }
  }

  /** Takes a presence lock on the LISTEN connection, under a random key not held by another dispatcher. */
  async #takePresence(client: pg.PoolClient): Promise<void> {
    try {
      for (let tries = 0; tries < 5 && this.#presence === undefined && this.#client === client; tries++) {
        const id = randomInt(1, 2 ** 31)
        const taken = await client.query<{ taken: boolean }>(
          'SELECT pg_try_advisory_lock($1::int4, $2::int4) AS taken',
          [q.PRESENCE_CLASS, id],
        )
        if (taken.rows[0]?.taken && this.#client === client) this.#presence = id
      }
    } catch (error) {
      // Without it, claims are freed by their lease alone, as before.
      if (this.#options.running()) this.#options.emit({ type: 'error', error })
    }
  }

  /** Sends the LISTEN's check notification from another connection, and gives up on it if it never arrives. */
  #sendCheck(client: pg.PoolClient): void {
    const { database, channel, emit, running } = this.#options
    const payload = `${LISTEN_CHECK}${randomUUID()}`
    const timer = setTimeout(() => {
      if (this.#client === client && this.#check?.payload === payload) void this.#giveUp()
    }, LISTEN_CHECK_MS)
    timer.unref?.()
    this.#check = { payload, timer }
    // Awaited by stop(), so a stopped dispatcher has no query left in flight (nor an error to report after it).
    this.#checkSent = database.query({ text: 'SELECT pg_notify($1, $2)', values: [channel, payload] }).then(
      () => {},
      (error: unknown) => {
        // Not sent, so nothing can be concluded: the next LISTEN checks again.
        clearTimeout(timer)
        if (this.#check?.payload === payload) this.#check = undefined
        if (running()) emit({ type: 'error', error })
      },
    )
  }

  /** The LISTEN never heard its check: says so once, and lets go of the client for good (polling alone from now). */
  async #giveUp(): Promise<void> {
    this.#deaf = true
    this.#check = undefined
    const release = this.#release
    this.#client = undefined
    this.#release = undefined
    this.#options.emit({
      type: 'listen_unavailable',
      error: new Error(
        `The outbox dispatcher's LISTEN did not hear its own NOTIFY within ${LISTEN_CHECK_MS / 1000} s: its pool goes through a pooler in transaction mode (PgBouncer, RDS Proxy...), which hands a LISTEN's connection to other clients, so no notification ever arrives. It polls every ${this.#options.pollIntervalMs} ms from now on; set createDispatcher({ listen: false }) to make that the configuration (and pollIntervalMs to the delay you accept), or give it a pool with connections of its own (session mode) to be woken at each commit.`,
      ),
    })
    await release?.()
  }
}
