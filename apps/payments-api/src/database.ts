import { setTimeout as sleep } from 'node:timers/promises'
import { distribute, migrate } from '@oncely/server'
import type pg from 'pg'
import { PAYMENT_PER_CHARGE } from './ledger.js'
import { migrateApp } from './migrate.js'

/** Schema of oncely's idempotency table. */
export const ONCELY_SCHEMA = 'oncely'

/** Options of {@link prepareDatabase}. */
export interface PrepareOptions {
  /**
   * The simulated provider's pool when it has a database of its own: its `provider_charges` table is created there.
   * @default undefined: the provider shares `pool`
   */
  providerPool?: pg.Pool
  /**
   * Chaos only (`ONCELY_UNSAFE_DISABLE_BACKSTOP=1`): drop the ledger's natural key (one payment per tenant and
   * charge), so the suite can prove it catches a retry after key expiry booking a second payment.
   * @default false
   */
  unsafeDisableBackstop?: boolean
  /**
   * `citus`: `pool` is a Citus coordinator; distribute the tables by tenant once they are migrated (see
   * {@link distributeByTenant}).
   * @default 'none'
   */
  distribution?: 'none' | 'citus'
}

/**
 * Brings the database up to date: oncely's idempotency table, then the demo's own tables. Both migrate in one
 * transaction under a transaction-scoped advisory lock, so several instances may call this at once when they start,
 * also through a pooler in transaction mode.
 *
 * @example
 * const { applied } = await prepareDatabase(pool)
 */
export async function prepareDatabase(
  pool: pg.Pool,
  options: PrepareOptions = {},
): Promise<{ applied: string[] }> {
  const oncely = await migrate(pool, { schema: ONCELY_SCHEMA })
  const app = await migrateApp(pool)
  if (options.providerPool && options.providerPool !== pool) await migrateApp(options.providerPool)
  // Without its natural key, the ledger books whatever reaches it (recordPayment always inserts).
  if (options.unsafeDisableBackstop)
    await pool.query(`ALTER TABLE payments DROP CONSTRAINT IF EXISTS ${PAYMENT_PER_CHARGE}`)
  if (options.distribution === 'citus') await distributeByTenant(pool)
  return { applied: [...oncely.applied, ...app] }
}

/**
 * On a Citus coordinator: `payments` and `outbox` distributed by `tenant_id` in one co-location group, and oncely's
 * key table and outbox in the same group (`distribute()`, by their scope, which the API sets to the tenant), so a
 * payment's key record, row and outbox event are on one node and commit there together. `provider_charges` stays a
 * plain table on the coordinator: it stands for another system, written on the provider's own connections, never in
 * a request's transaction (give it a database of its own with PROVIDER_DATABASE_URL). Idempotent, and safe from
 * several instances at once.
 */
export async function distributeByTenant(pool: pg.Pool): Promise<void> {
  const client = await pool.connect()
  try {
    await client.query('BEGIN')
    await client.query('SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', ['payments-api:distribute'])
    for (const [table, colocateWith] of [
      ['payments', 'default'],
      ['outbox', 'payments'],
    ] as const) {
      const known = await client.query('SELECT 1 FROM pg_dist_partition WHERE logicalrelid = $1::regclass', [
        table,
      ])
      if (known.rowCount) continue
      await client.query(`SELECT create_distributed_table($1, 'tenant_id', colocate_with => $2)`, [
        table,
        colocateWith,
      ])
      // Rows written before are copied to the shards; the coordinator's copy is no longer read.
      await client.query('SELECT truncate_local_data_after_distributing_table($1)', [table])
    }
    await client.query('COMMIT')
  } catch (error) {
    await client.query('ROLLBACK').catch(() => {})
    throw error
  } finally {
    client.release()
  }
  await distribute(pool, { schema: ONCELY_SCHEMA, colocateWith: 'payments' })
}

/** SQLSTATEs that mean "Postgres is not there yet" rather than "this request is wrong". */
const NOT_THERE_YET = new Set([
  '57P01', // admin_shutdown: a fast shutdown or pg_terminate_backend
  '57P02', // crash_shutdown
  '57P03', // cannot_connect_now: starting up, shutting down, or a standby being promoted
  '53300', // too_many_connections
])

/**
 * Whether `error` says the database cannot be reached now (refused, reset, terminated, starting up, or a pooler
 * that cannot reach its server), as opposed to an error that waiting would not fix (a bad password, a bad query).
 */
export function isUnreachable(error: unknown): boolean {
  const { code, message } = (error ?? {}) as { code?: unknown; message?: unknown }
  if (typeof code === 'string') {
    // Class 08 (connection exception) includes what PgBouncer answers when it cannot reach Postgres.
    if (code.startsWith('08') || NOT_THERE_YET.has(code)) return true
    if (/^E[A-Z]+$/.test(code))
      return ['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH'].includes(code)
  }
  return (
    typeof message === 'string' &&
    /Connection terminated|timeout exceeded when trying to connect|the database system is (starting up|shutting down|not yet accepting)/i.test(
      message,
    )
  )
}

/** Options of {@link untilReachable}. */
export interface UntilReachableOptions {
  /** What is waited for, for the log line: `the database at 127.0.0.1:5432/payments`. */
  what: string
  /** One line per failed try: what is waited for, why, and when the next try comes. */
  log: (line: string) => void
  /** Told the reason while waiting, and `undefined` once `attempt` succeeded (the health route shows it). */
  onWaiting?: (reason: string | undefined) => void
  /** The first wait; each next one doubles, up to `maxDelayMs`. @default 250 */
  initialDelayMs?: number
  /** The longest wait between two tries: the backoff is bounded, the waiting is not. @default 5000 */
  maxDelayMs?: number
  /** Ends the waiting (a SIGTERM while starting): the promise rejects with the signal's reason. */
  signal?: AbortSignal
}

/**
 * Runs `attempt` until it succeeds, waiting with bounded exponential backoff after each failure that says the
 * database is unreachable ({@link isUnreachable}); any other failure is thrown at once. An instance started while
 * its database is down or restarting (a failover, a restart) waits for it instead of exiting.
 *
 * @example
 * await untilReachable(() => prepareDatabase(pool), { what: 'the database', log: console.warn })
 */
export async function untilReachable<T>(
  attempt: () => Promise<T>,
  options: UntilReachableOptions,
): Promise<T> {
  const maxDelayMs = options.maxDelayMs ?? 5000
  let delay = options.initialDelayMs ?? 250
  for (;;) {
    options.signal?.throwIfAborted()
    try {
      const result = await attempt()
      options.onWaiting?.(undefined)
      return result
    } catch (error) {
      if (!isUnreachable(error)) throw error
      const reason = error instanceof Error ? error.message : String(error)
      options.onWaiting?.(reason)
      options.log(`waiting for ${options.what} (${reason}); next try in ${(delay / 1000).toFixed(1)} s`)
      await sleep(delay, undefined, { signal: options.signal })
      delay = Math.min(maxDelayMs, delay * 2)
    }
  }
}
