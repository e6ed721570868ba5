// Keeps the replay cache's knowledge of the server's replication current (store/replication.ts): asked when the
// cache reaches a server it has not checked, every REPLICATION_CHECK_MS after, and within REPLICATION_RECHECK_MS of
// a new entry (which answers only after a check sent after it), one question at a time and off the request's path.
// Until a check has answered for the server the cache confirms, the cache does not answer. A check that fails is a
// store error like any other statement's: reported, and the cache emptied (see Answers.storeError).
import { performance } from 'node:perf_hooks'
import type { Database } from '../store/database.js'
import { type ReplicationRow, replicationCheck, replicationSafe } from '../store/replication.js'
import type { ReplayCache } from './replay-cache.js'

/** After a check that failed (the database unreachable), the next one waits this long: one query per request at most. */
const RETRY_AFTER_FAILURE_MS = 1_000

export class ReplicationCheck {
  readonly #cache: ReplayCache
  readonly #database: Pick<Database<unknown>, 'query'>
  readonly #failed: (error: unknown) => void
  #inFlight = false
  #notBefore = Number.NEGATIVE_INFINITY
  #toldUnsafe = false

  constructor(
    cache: ReplayCache,
    database: Pick<Database<unknown>, 'query'>,
    failed: (error: unknown) => void,
  ) {
    this.#cache = cache
    this.#database = database
    this.#failed = failed
  }

  /** Starts a check when one is due; never waits for it. */
  refresh(): void {
    const now = performance.now()
    if (this.#inFlight || now < this.#notBefore || !this.#cache.replicationCheckDue(now)) return
    this.#inFlight = true
    // Through a microtask, so a datasource that refuses the statement synchronously cannot fail the request.
    Promise.resolve()
      .then(() => this.#database.query<ReplicationRow>(replicationCheck))
      .then(
        ({ rows }) => {
          this.#inFlight = false
          const row = rows[0]
          if (!row) return
          const safe = replicationSafe(row)
          this.#cache.replicationChecked(row.server, safe, now)
          if (!safe) this.#tellUnsafe(row)
        },
        (error: unknown) => {
          // Unanswered: the check is asked again shortly; entries stored since the last check keep waiting for one.
          this.#inFlight = false
          this.#notBefore = performance.now() + RETRY_AFTER_FAILURE_MS
          this.#failed(error)
        },
      )
  }

  #tellUnsafe(row: ReplicationRow): void {
    if (this.#toldUnsafe) return
    this.#toldUnsafe = true
    console.warn(
      `oncely: the replay cache does not answer while Postgres streams to a standby that its commits do not wait for (${row.standbys} standby(s), synchronous_standby_names '${row.standby_names}', synchronous_commit '${row.synchronous_commit}'): a failover to it can lose commits already acknowledged, and the cache would replay their responses. Replays are read from the database instead. To keep the cache, make the failover candidates synchronous standbys (synchronous_standby_names); to say the cache is meant to be off, set createEngine({ replayCache: false }).`,
    )
  }
}
