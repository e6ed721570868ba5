// The statements of the `reservation: 'lock'` protocol (see lock-reservation.ts): a transaction-scoped advisory
// lock on the key, the key's row read after it, and the finished record written as one fenced upsert just before
// COMMIT. Each is an SQL-level prepared statement so it can travel in one simple-protocol message with BEGIN or
// COMMIT (arguments as literals), and a protocol-level one for large bodies and for `preparedStatements: false`.
import type { TableNames } from './identifiers.js'
import {
  FENCE_MARKER,
  KEEP_RECOVERY_POINT,
  LOOKUP_COLUMNS,
  type LookupRow,
  leaseGuard,
  literal,
  ms,
  PK,
  type Query,
  type RecordId,
  replaceRow,
  type SqlStatement,
  sqlStatement,
  statement,
} from './queries.js'

/**
 * The advisory lock and the key's row in one statement. The lock is a 64-bit hash of the table, scope, operation
 * and key (length-prefixed, so no two triples share a text), transaction-scoped, so it ends with the business
 * transaction whatever happens to the process. A collision of two in-flight keys only answers one of them 409.
 *
 * The same statement arms the lease guard ({@link leaseGuard}, the lease in milliseconds as `$4`): the
 * transaction, and so the lock, cannot outlive a holder that stopped while alive by more than the lease.
 *
 * The row is read with the statement's snapshot, taken just before the lock is granted. So a holder that commits
 * and lets go of the lock in between can be missed: this attempt then runs, and its finishing upsert, fenced on
 * "no row", fails and rolls back, and the attempt answers with the holder's response. Correct, and cheaper on every
 * request than a second statement whose snapshot would follow the lock.
 */
function lockAndLookupText(names: TableNames): string {
  return `SELECT pg_try_advisory_xact_lock(${lockKey(names)}) AS locked, ${leaseGuard('$4')} AS lease_guard, e.*
FROM (SELECT 1) AS one LEFT JOIN (${lockedRow(names)}) AS e ON true`
}

/** The key's advisory lock: a 64-bit hash of the table, scope ($1), operation ($2) and key ($3). */
const lockKey = (names: TableNames) =>
  `hashtextextended(${literal(`${names.qualified}|`)} || length($1) || ':' || $1 || '|' || length($2) || ':' || $2 || '|' || $3, 0)`

const lockedRow = (names: TableNames) =>
  `SELECT ${LOOKUP_COLUMNS}, attempts, recovery_point, lock_token::text AS lock_token, updated_at::text AS version
  FROM ${names.qualified} WHERE ${PK}`

/**
 * Whether another attempt holds the key's lock, and the key's row, without taking the lock: a probe that took it,
 * even for one statement, could make a real attempt fail to get it and answer 409 for nothing. Postgres lists a
 * bigint advisory lock in pg_locks as its high and low 32 bits (`classid`, `objid`) with `objsubid` 1.
 *
 * The database's oid comes from this session's own activity row rather than from pg_database: on Citus, the
 * statement then reads no table but the key table, so it runs whole on the node holding the key's shard, where the
 * lock is (with pg_database it would read pg_locks on the coordinator, where the lock never is).
 */
export function inspectQuery(names: TableNames, id: RecordId): Query {
  return {
    ...statement(
      names,
      'inspect_lock',
      () => `SELECT EXISTS (
  SELECT 1 FROM pg_locks, (SELECT ${lockKey(names)} AS h) AS k
  WHERE locktype = 'advisory' AND objsubid = 1 AND granted
    AND database = (SELECT datid FROM pg_stat_get_activity(pg_backend_pid()))
    AND classid = ((k.h >> 32) & 4294967295)::oid AND objid = (k.h & 4294967295)::oid
) AS held, e.*
FROM (SELECT 1) AS one LEFT JOIN (${lockedRow(names)}) AS e ON true`,
    ),
    values: [id.scope, id.operation, id.key],
  }
}

/** The inspection's answer: whether the lock is held, and the row (all null when there is none). */
export type InspectedLock = { held: boolean } & (LockedLookupRow | { [K in keyof LockedLookupRow]: null })

/** The lock-mode lookup's answer: whether the lock was granted, and the row (all null when there is none). */
export type LockedLookup = { locked: boolean } & (LockedLookupRow | { [K in keyof LockedLookupRow]: null })

/** The row as the lock-mode lookup returns it; `version` identifies the row version for the finishing fence. */
export interface LockedLookupRow extends LookupRow {
  attempts: number
  recovery_point: string | null
  lock_token: string | null
  version: string
}

/** `BEGIN; EXECUTE lock_and_lookup(...)`: one round trip; the statement's row is the second result. */
export function beginLockAndLookup(
  names: TableNames,
  id: RecordId,
  leaseMs: number,
): { statement: SqlStatement; text: string } {
  if (!Number.isSafeInteger(leaseMs)) throw new TypeError('Expected `leaseMs` to be an integer.')
  const statement = sqlStatement(names, 'lock', '(text, text, text, text)', () => lockAndLookupText(names))
  const args = [id.scope, id.operation, id.key, String(leaseMs)].map(literal).join(', ')
  return { statement, text: `BEGIN; EXECUTE ${statement.name}(${args})` }
}

/** The same statement with parameters, for `preparedStatements: false` (sent after a plain BEGIN). */
export function lockAndLookupQuery(names: TableNames, id: RecordId, leaseMs: number): Query {
  const { text } = statement(names, 'lock', () => lockAndLookupText(names))
  return { text, values: [id.scope, id.operation, id.key, String(leaseMs)] }
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
    status: `CASE WHEN ${fence} THEN excluded.status ELSE (k.status || ${literal(` ${FENCE_MARKER}`)})::int::text END`,
    attempts: 'excluded.attempts',
    recoveryPoint: KEEP_RECOVERY_POINT,
  })}`
}

// The seen version ($10) is a timestamptz parameter rather than a text cast in the statement: Citus refuses a cast
// that is not IMMUTABLE (text to timestamptz depends on the time zone) in the DO UPDATE clause.
const FINISH_TYPES =
  '(text, text, text, text, text, integer, jsonb, bytea, jsonb, timestamptz, text, float8, integer, uuid)'

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

/** `EXECUTE finish(...); COMMIT` as one simple-protocol message (for bodies up to {@link INLINE_BODY_BYTES}). */
export function finishAndCommit(
  names: TableNames,
  id: RecordId,
  record: FinishRecord,
  fenced: boolean,
): { statement: SqlStatement; text: string } {
  if (![record.retentionMs, record.response.status, record.attempt].every(Number.isSafeInteger)) {
    throw new TypeError('Expected `retentionMs`, `attempt` and the response status to be integers.')
  }
  const statement = sqlStatement(names, fenced ? 'finish' : 'finish_unfenced', FINISH_TYPES, () =>
    finishText(names, fenced),
  )
  const text = (value: string | null) => (value === null ? 'NULL' : literal(value))
  const [scope, operation, key, fingerprint, status, , headers, , requestHeaders, version, seenStatus] =
    finishValues(id, record) as (string | null)[]
  const args = [
    text(scope!),
    text(operation!),
    text(key!),
    text(fingerprint!),
    text(status!),
    String(record.response.status),
    text(headers!),
    `decode('${record.response.body.toString('hex')}', 'hex')`,
    text(requestHeaders ?? null),
    text(version ?? null),
    text(seenStatus ?? null),
    String(record.retentionMs),
    String(record.attempt),
    literal(record.token),
  ]
  return { statement, text: `EXECUTE ${statement.name}(${args.join(', ')}); COMMIT` }
}

/** The finishing upsert with parameters (large bodies; `preparedStatements: false` sends it unnamed). */
export function finishQuery(names: TableNames, id: RecordId, record: FinishRecord, fenced: boolean): Query {
  return {
    ...statement(names, fenced ? 'finish' : 'finish_unfenced', () => finishText(names, fenced)),
    values: finishValues(id, record),
  }
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
export function saveRecoveryPoint(names: TableNames, id: RecordId, save: LockedRecoveryPoint): Query {
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
