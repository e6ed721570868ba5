// The statements of the `reservation: 'lock'` protocol (see lock-reservation.ts): a transaction-scoped advisory
// lock on the key, the key's row read after it, and the finished record written as one fenced upsert just before
// COMMIT (a datasource may send the lock and the lookup with their BEGIN, and the finish with its COMMIT, in one
// message each).
import type { Statement } from './database.js'
import type { TableNames } from './identifiers.js'
import {
  FENCE_MARKER,
  KEEP_RECOVERY_POINT,
  LOOKUP_COLUMNS,
  type LookupRow,
  leaseGuard,
  ms,
  named,
  PK,
  type RecordId,
  replaceRow,
  SERVER,
  sqlConstant,
} from './queries.js'

/**
 * The advisory lock. It is a 64-bit hash of the table, scope, operation and key (length-prefixed, so no two triples
 * share a text), transaction-scoped, so it ends with the business transaction whatever happens to the process. A
 * collision of two in-flight keys only answers one of them 409.
 *
 * The same statement arms the lease guard ({@link leaseGuard}, the lease in milliseconds as `$4`): the
 * transaction, and so the lock, cannot outlive a holder that stopped while alive by more than the lease.
 *
 * The key's row is read by the next statement ({@link lockedLookupText}), never by this one: a statement reads with
 * the snapshot taken when it started, before its lock was granted, so it can miss the record of a holder that
 * committed (and so let go of the lock) in between, and run the handler a second time. The next statement's snapshot
 * is taken after the lock was granted: it sees every commit of whoever held the lock before.
 */
export function lock(names: TableNames, id: RecordId, leaseGuardMs: number): Statement {
  return named(
    names,
    'lock',
    ['text', 'text', 'text', 'text'],
    () =>
      `SELECT pg_try_advisory_xact_lock(${lockKey(names)}) AS locked, ${leaseGuard('$4')} AS lease_guard, ${SERVER}
${onKeysShard(names)}`,
    [id.scope, id.operation, id.key, String(leaseGuardMs)],
  )
}

/**
 * A FROM clause that names the key's row but reads nothing of it (`LIMIT 0`): one row, whatever is stored. On Citus a
 * statement with no table runs on the node the session is connected to; with this one it runs whole on the node
 * holding the key's shard, so the lock and the lease guard are taken there, the one node every attempt on the key
 * reaches, whichever node its session is on. On one Postgres it costs a plan node that is never run.
 */
const onKeysShard = (names: TableNames) =>
  `FROM (SELECT 1) AS one LEFT JOIN (SELECT 1 FROM ${names.qualified}
  WHERE ${PK} LIMIT 0) AS on_keys_shard ON true`

/** The key's row, read by the statement after {@link lock}. */
export function lockedLookup(names: TableNames, id: RecordId): Statement {
  return named(names, 'locked_lookup', ['text', 'text', 'text'], () => lockedRow(names), [
    id.scope,
    id.operation,
    id.key,
  ])
}

/** The key's advisory lock: a 64-bit hash of the table, scope ($1), operation ($2) and key ($3). */
const lockKey = (names: TableNames) =>
  `hashtextextended(${sqlConstant(`${names.qualified}|`)} || length($1) || ':' || $1 || '|' || length($2) || ':' || $2 || '|' || $3, 0)`

const lockedRow = (names: TableNames) =>
  `SELECT ${LOOKUP_COLUMNS}, attempts, recovery_point, lock_token::text AS lock_token, updated_at::text AS version
  FROM ${names.qualified} WHERE ${PK}`

/**
 * The key's advisory lock as pg_locks lists it, granted to someone: Postgres shows a bigint advisory lock as its
 * high and low 32 bits (`classid`, `objid`) with `objsubid` 1. The database's oid comes from this session's own
 * activity row rather than from pg_database: on Citus a statement that reads a catalog table is planned apart from
 * the key's shard, and would read pg_locks on the coordinator, where the lock is not.
 */
const heldLock = (names: TableNames) => `pg_locks l, (SELECT ${lockKey(names)} AS h) AS k
  WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
    AND l.database = (SELECT datid FROM pg_stat_get_activity(pg_backend_pid()))
    AND l.classid = ((k.h >> 32) & 4294967295)::oid AND l.objid = (k.h & 4294967295)::oid`

/**
 * How long the holder of the key's lock has been in its transaction, from pg_stat_activity (null when nobody holds
 * it, or when this role may not see the holder's session): what a duplicate's `Retry-After` is estimated from. The
 * view's function rather than the view, which joins catalog tables (see {@link heldLock}).
 */
const holderMs = (
  names: TableNames,
) => `(SELECT (extract(epoch FROM (clock_timestamp() - min(a.xact_start))) * 1000)::float8
  FROM pg_stat_get_activity(NULL) a, ${heldLock(names)} AND a.pid = l.pid) AS holder_ms`

/**
 * Whether another attempt holds the key's lock (and since when), and the key's row, without taking the lock: a
 * probe that took it, even for one statement, could make a real attempt fail to get it and answer 409 for nothing.
 */
export function inspect(names: TableNames, id: RecordId): Statement {
  return named(
    names,
    'inspect_lock',
    ['text', 'text', 'text'],
    () => `SELECT EXISTS (SELECT 1 FROM ${heldLock(names)}) AS held, ${holderMs(names)}, e.*, ${SERVER}
FROM (SELECT 1) AS one LEFT JOIN (${lockedRow(names)}) AS e ON true`,
    [id.scope, id.operation, id.key],
  )
}

/** How long the holder of a key's lock has held it, asked by a duplicate that did not get the lock. */
export function holder(names: TableNames, id: RecordId): Statement {
  return named(
    names,
    'lock_holder',
    ['text', 'text', 'text'],
    () => `SELECT ${holderMs(names)} ${onKeysShard(names)}`,
    [id.scope, id.operation, id.key],
  )
}

/** The inspection's answer: whether the lock is held, and the row (all null when there is none). */
export type InspectedLock = { held: boolean; holder_ms: number | null } & (
  | LockedLookupRow
  | { [K in keyof LockedLookupRow]: null }
)

/** The lock statement's answer: whether the lock was granted. */
export interface Locked {
  locked: boolean
  server: number
}

/** The row as the lock-mode lookup returns it; `version` identifies the row version for the finishing fence. */
export interface LockedLookupRow extends LookupRow {
  attempts: number
  recovery_point: string | null
  lock_token: string | null
  version: string
}

/** What the finishing upsert stores. */
export interface FinishRecord {
  fingerprint: string
  status: 'succeeded' | 'failed_permanent'
  response: { status: number; headers: Record<string, string>; body: Buffer }
  requestHeaders: Record<string, string> | null
  retentionMs: number
  /** The row version the attempt saw after taking the lock (null: there was no row). */
  seen: { version: string; status: string } | null
  /** This attempt's number, stored as `attempts`. */
  attempt: number
  /** This attempt's token: a row it saved a recovery point on carries it (see {@link saveRecoveryPoint}). */
  token: string
}

/**
 * Which row versions an attempt may replace: the one it saw after taking the lock, or one carrying its own token
 * (written by its own recovery point). As SQL over `k` (the existing row), with the seen version and status, and
 * the token, as parameters.
 */
const ours = (version: string, status: string, token: string) =>
  `((k.updated_at = ${version}::timestamptz AND k.status = ${status}) OR (k.lock_token = ${token}::uuid AND k.status = 'in_progress'))`

/**
 * The finished record as one upsert, fenced: it inserts when there is no row, and otherwise replaces only the row
 * version this attempt saw (an expired, released or abandoned record it took over). When anything else happened to
 * the row meanwhile (another protocol's reservation, a late completion by an attempt whose lease ran out), the
 * statement fails with {@link FENCE_MARKER} and the transaction, business writes included, is rolled back. A key
 * that was not expired keeps its first expiry, as in the row protocol.
 *
 * The failure is a cast of a text that depends on the row, so the planner cannot fold it into a constant (and fail
 * at PREPARE); an upsert with a WHERE clause would instead report zero rows, which would take a round trip to
 * inspect before the COMMIT.
 */
function finishText(names: TableNames, fenced: boolean): string {
  const t = names.qualified
  const fence = fenced
    ? ours('$10', '$11', '$14')
    : '$10::timestamptz IS NULL OR $11::text IS NULL OR $14::uuid IS NULL OR true'
  return `INSERT INTO ${t} AS k (scope, operation, key, fingerprint, status, request_headers, response_status,
  response_headers, response_body, attempts, created_at, updated_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $9::jsonb, $6, $7::jsonb, $8::bytea, $13, now(), now(), now() + ${ms('$12')})
ON CONFLICT (scope, operation, key) DO UPDATE SET
  ${replaceRow({
    status: `CASE WHEN ${fence} THEN excluded.status ELSE (k.status || ${sqlConstant(` ${FENCE_MARKER}`)})::int::text END`,
    attempts: 'excluded.attempts',
    recoveryPoint: KEEP_RECOVERY_POINT,
  })}`
}

// The seen version ($10) is a timestamptz parameter rather than a text cast in the statement: Citus refuses a cast
// that is not IMMUTABLE (text to timestamptz depends on the time zone) in the DO UPDATE clause.
const FINISH_TYPES = [
  'text',
  'text',
  'text',
  'text',
  'text',
  'integer',
  'jsonb',
  'bytea',
  'jsonb',
  'timestamptz',
  'text',
  'float8',
  'integer',
  'uuid',
]

function finishValues(id: RecordId, record: FinishRecord): unknown[] {
  return [
    id.scope,
    id.operation,
    id.key,
    record.fingerprint,
    record.status,
    record.response.status,
    JSON.stringify(record.response.headers),
    record.response.body,
    record.requestHeaders === null ? null : JSON.stringify(record.requestHeaders),
    record.seen?.version ?? null,
    record.seen?.status ?? null,
    record.retentionMs,
    record.attempt,
    record.token,
  ]
}

/** The finishing upsert, sent last before the COMMIT. */
export function finish(names: TableNames, id: RecordId, record: FinishRecord, fenced: boolean): Statement {
  return named(
    names,
    fenced ? 'finish' : 'finish_unfenced',
    FINISH_TYPES,
    () => finishText(names, fenced),
    finishValues(id, record),
  )
}

/** What a recovery point saved under the lock protocol writes. */
export interface LockedRecoveryPoint {
  fingerprint: string
  point: string
  token: string
  attempt: number
  leaseMs: number
  retentionMs: number
  requestHeaders: Record<string, string> | null
  seen: { version: string; status: string } | null
}

/**
 * A recovery point under the lock protocol. Nothing was committed for the key yet, so the first save writes the
 * row the row protocol would have: `in_progress`, this attempt's token, a lease, and the point. From then on the key
 * behaves as in the row protocol if this attempt dies: duplicates get 409 until the lease runs out, then the next
 * attempt takes over with the saved point. Fenced like the finish; zero rows means another attempt got the key.
 */
export function saveRecoveryPoint(names: TableNames, id: RecordId, save: LockedRecoveryPoint): Statement {
  const t = names.qualified
  return {
    text: `INSERT INTO ${t} AS k (scope, operation, key, fingerprint, status, lock_token, locked_until,
  request_headers, recovery_point, attempts, created_at, updated_at, expires_at)
VALUES ($1, $2, $3, $4, 'in_progress', $5::uuid, now() + ${ms('$6')}, $7::jsonb, $8, $9, now(), now(),
  now() + ${ms('$10')})
ON CONFLICT (scope, operation, key) DO UPDATE SET
  ${replaceRow({ status: 'excluded.status', attempts: 'excluded.attempts', recoveryPoint: 'excluded.recovery_point' })}
WHERE ${ours('$11', '$12', '$5')}`,
    values: [
      id.scope,
      id.operation,
      id.key,
      save.fingerprint,
      save.token,
      save.leaseMs,
      save.requestHeaders === null ? null : JSON.stringify(save.requestHeaders),
      save.point,
      save.attempt,
      save.retentionMs,
      save.seen?.version ?? null,
      save.seen?.status ?? null,
    ],
  }
}
