// Every statement of the outbox, as small functions returning a Statement (store/database.ts). Times come from the
// database clock.
import type { Statement } from '../store/database.js'

const ms = (param: string) => `(${param}::float8 * interval '1 millisecond')`

/**
 * The first key of every dispatcher's presence lock, `pg_advisory_lock(PRESENCE_CLASS, id)`: a session-level lock a
 * started dispatcher holds on its LISTEN connection, whose second key its claims record as `claimed_by`. Postgres
 * drops the lock with the session, so a claim whose lock is gone belongs to a dispatcher that is no more.
 */
export const PRESENCE_CLASS = 0x6f6e6365

/**
 * Whether the claim of row `alias` is free: its lease ran out, or it names a presence lock no session holds. The
 * held locks are read once per statement (an uncorrelated subquery), from `pg_locks`, which every role may read.
 */
function claimFree(alias: string, presence: boolean): string {
  const lease = `${alias}claimed_until <= now()`
  if (!presence) return lease
  return `(${lease} OR (${alias}claimed_by IS NOT NULL AND ${alias}claimed_by NOT IN (
    SELECT l.objid::int8 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
      AND l.classid = ${PRESENCE_CLASS}::oid AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))))`
}

/**
 * Serializes enqueues of one aggregate until commit, so sequence order equals commit order per aggregate (without
 * it, a later `seq` could commit first and be published before an earlier one becomes visible).
 */
export function lockAggregate(table: string, aggregateKey: string): Statement {
  return {
    // Cast: a void column is one some libraries cannot read (Prisma).
    text: 'SELECT pg_advisory_xact_lock(hashtextextended($1, 0))::text',
    values: [`${table}:${aggregateKey}`],
  }
}

export function insert(
  table: string,
  channel: string,
  row: {
    id: string
    scope: string
    topic: string
    aggregateKey: string | null
    payload: string
    headers: object
  },
): Statement {
  return {
    text: `WITH inserted AS (
  INSERT INTO ${table} (id, scope, topic, aggregate_key, payload, headers) VALUES ($1, $7, $2, $3, $4::jsonb, $5)
  RETURNING id
) SELECT pg_notify($6, '')::text FROM inserted`,
    values: [row.id, row.topic, row.aggregateKey, row.payload, row.headers, channel, row.scope],
  }
}

/**
 * Dead-letters rows whose dispatcher crashed on their last allowed attempt (their claim is free); of one tenant
 * when `scope` is given (a distributed outbox, where a statement must stay within one shard, and where presence
 * locks, taken on the coordinator, cannot be seen: leases alone free claims there).
 */
export function buryExhausted(table: string, maxAttempts: number, scope?: string): Statement {
  return {
    text: `UPDATE ${table} SET status = 'dead', claim_token = NULL, claimed_until = NULL, claimed_by = NULL,
  last_error = coalesce(last_error, 'claim lease expired on the last attempt')
WHERE status = 'pending' AND ${claimFree('', scope === undefined)} AND attempts >= $1${scope === undefined ? '' : ' AND scope = $2'}`,
    values: scope === undefined ? [maxAttempts] : [maxAttempts, scope],
  }
}

/**
 * The tenants with a row to claim or to bury, up to `limit` of them, the oldest message first (no tenant waits
 * behind others for ever), on a distributed outbox: a read over every shard that locks nothing, after which each
 * tenant's rows are claimed by a statement on its shard.
 */
export function tenantsDue(table: string, maxAttempts: number, limit: number): Statement {
  return {
    text: `SELECT scope FROM ${table}
WHERE status = 'pending' AND (claimed_until IS NULL OR claimed_until <= now())
  AND (available_at <= now() OR attempts >= $1)
GROUP BY scope ORDER BY min(seq) LIMIT $2`,
    values: [maxAttempts, limit],
  }
}

/**
 * Claims up to `batchSize` due rows for `leaseMs`, recording `claimant` (the dispatcher's presence lock, or null).
 * A row is skipped while an earlier row of its aggregate is pending (claimed or not), so one aggregate never has two
 * messages in flight. SKIP LOCKED lets dispatchers run side by side. With `scope`, only that tenant's rows, and its
 * aggregates are the tenant's own (a distributed outbox: Citus runs FOR UPDATE only in a statement on one shard).
 */
export function claim(
  table: string,
  token: string,
  batchSize: number,
  leaseMs: number,
  claimant: number | null,
  scope?: string,
): Statement {
  const [own, ownAggregate] = scope === undefined ? ['', ''] : [' AND o.scope = $5', ' AND p.scope = $5']
  return {
    text: `WITH due AS (
  SELECT o.scope, o.id FROM ${table} o
  WHERE o.status = 'pending' AND o.available_at <= now()${own}
    AND (o.claimed_until IS NULL OR ${claimFree('o.', scope === undefined)})
    AND (o.aggregate_key IS NULL OR NOT EXISTS (
      SELECT 1 FROM ${table} p WHERE p.status = 'pending' AND p.aggregate_key = o.aggregate_key AND p.seq < o.seq${ownAggregate}))
  ORDER BY o.seq
  LIMIT $2
  FOR UPDATE OF o SKIP LOCKED
)
UPDATE ${table} o SET claim_token = $1, claimed_until = now() + ${ms('$3')}, claimed_by = $4::int8,
  attempts = o.attempts + 1
FROM due WHERE o.scope = due.scope AND o.id = due.id
RETURNING o.id, o.scope, o.topic, o.aggregate_key, o.payload, o.headers, o.attempts, o.created_at, o.seq`,
    values:
      scope === undefined
        ? [token, batchSize, leaseMs, claimant]
        : [token, batchSize, leaseMs, claimant, scope],
  }
}

export interface ClaimRow {
  id: string
  scope: string
  topic: string
  aggregate_key: string | null
  payload: unknown
  headers: Record<string, string>
  attempts: number
  created_at: Date
  seq: string
}

/** Marks a row published, fenced by the claim token: a dispatcher whose lease was taken over changes nothing. */
export function markPublished(table: string, row: { scope: string; id: string }, token: string): Statement {
  return {
    text: `UPDATE ${table} SET status = 'published', published_at = now(), claim_token = NULL, claimed_until = NULL,
  claimed_by = NULL
WHERE scope = $3 AND id = $1 AND claim_token = $2 AND status = 'pending'`,
    values: [row.id, token, row.scope],
  }
}

/** Releases a failed row for a later attempt, or dead-letters it once `maxAttempts` is reached; fenced. */
export function markFailed(
  table: string,
  row: { scope: string; id: string },
  token: string,
  error: string,
  delayMs: number,
  maxAttempts: number,
): Statement {
  return {
    text: `UPDATE ${table} SET claim_token = NULL, claimed_until = NULL, claimed_by = NULL, last_error = $3,
  available_at = now() + ${ms('$4')},
  status = CASE WHEN attempts >= $5 THEN 'dead' ELSE 'pending' END
WHERE scope = $6 AND id = $1 AND claim_token = $2 AND status = 'pending'
RETURNING status`,
    values: [row.id, token, error, delayMs, maxAttempts, row.scope],
  }
}

/** Deletes up to `batchSize` rows published more than `olderThanMs` ago. */
export function purgePublished(table: string, olderThanMs: number, batchSize: number): Statement {
  return { text: purgeText(table, '$1', '$2'), values: [olderThanMs, batchSize] }
}

/** The purge's statement on `table` (or a shard's table), with its age and batch size as SQL. */
export function purgeText(table: string, olderThanMs: string, batchSize: string): string {
  return `DELETE FROM ${table} WHERE (scope, id) IN (
  SELECT scope, id FROM ${table} WHERE status = 'published' AND published_at <= now() - ${ms(olderThanMs)}
  LIMIT ${batchSize} FOR UPDATE SKIP LOCKED)`
}

/** Puts dead-lettered rows back in the queue with a fresh attempt budget. */
export function requeueDead(table: string, ids: readonly string[]): Statement {
  return {
    text: `UPDATE ${table} SET status = 'pending', attempts = 0, available_at = now(), last_error = NULL
WHERE status = 'dead' AND id = ANY($1::uuid[])`,
    values: [ids],
  }
}
