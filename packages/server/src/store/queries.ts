// Every statement the engine sends, as small functions returning { text, values } with $n parameters only. The
// table name is quoted once, in tableNames(); all times come from the database clock (now()).
import { createHash } from 'node:crypto'
import type { TableNames } from './identifiers.js'

export interface Query {
  /**
   * Set on the hot statements: node-postgres then prepares the statement once per connection and Postgres reuses
   * its plan, instead of parsing and planning it again on every request (planning cost as much as executing).
   */
  name?: string
  text: string
  values: unknown[]
}

// A prepared statement's name must be unique per text on a connection (node-postgres refuses a known name with
// another text), so it is derived from the text itself: two stores on different tables, or the unfenced completion,
// get different names, well under Postgres' 63-byte limit. The texts depend only on the table, so each is built,
// hashed and named once per TableNames.
const memo = new WeakMap<TableNames, Map<string, unknown>>()
/** Builds what `kind` needs for a table once, then returns the same object (the texts are hashed once, not per request). */
function once<T>(names: TableNames, kind: string, create: () => T): T {
  let known = memo.get(names)
  if (!known) {
    known = new Map()
    memo.set(names, known)
  }
  if (!known.has(kind)) known.set(kind, create())
  return known.get(kind) as T
}

const textHash = (text: string) => createHash('sha256').update(text).digest('hex').slice(0, 24)

export function statement(
  names: TableNames,
  kind: string,
  build: () => string,
): { name: string; text: string } {
  return once(names, kind, () => {
    const text = build()
    return { name: `oncely_${kind}_${textHash(text)}`, text }
  })
}

export interface RecordId {
  scope: string
  operation: string
  key: string
}

export const PK = 'scope = $1 AND operation = $2 AND key = $3'
export const LOOKUP_COLUMNS = `fingerprint, status, expires_at <= now() AS expired,
  (extract(epoch FROM (expires_at - now())) * 1000)::float8 AS expires_in_ms,
  greatest(0, ceil(extract(epoch FROM (locked_until - now())) * 1000))::float8 AS lease_remaining_ms,
  response_status, response_headers, response_body`

export const ms = (param: string) => `(${param}::float8 * interval '1 millisecond')`

/**
 * The reservation, one atomic statement: insert the key, or take over a row that is expired, released after a
 * retryable failure, or whose lease ran out. A row with another fingerprint is only replaced once expired, so a
 * mismatch is always reported.
 *
 * The same round trip also returns the row as the statement's snapshot saw it, and the INSERT is not even attempted
 * when that row is finished, held under a live lease, or has another fingerprint. So a replay, a 409 and a 422 cost
 * one statement and take no row lock (ON CONFLICT DO UPDATE locks the conflicting row even when its WHERE is false,
 * which would serialize every replay of a key). When the snapshot is stale, the ON CONFLICT clause decides on the
 * latest row version, and the caller re-reads.
 *
 * It commits with synchronous_commit off (set for this statement's own transaction only), saving a WAL flush per
 * request. That is safe: WAL is flushed in order, so the reservation is durable no later than the business
 * transaction that completes it; if Postgres crashes before, the lost reservation only frees the key, and nothing
 * that depended on it can have committed. A duplicate may have seen it and answered 409, which is retryable.
 */
export function reserve(
  names: TableNames,
  id: RecordId,
  fingerprint: string,
  token: string,
  leaseMs: number,
  retentionMs: number,
  requestHeaders: Record<string, string> | null,
): Query {
  const t = names.qualified
  const prepared = statement(
    names,
    'reserve',
    () => `WITH existing AS (
  SELECT ${LOOKUP_COLUMNS} FROM ${t} WHERE ${PK}
), reserved AS (
  INSERT INTO ${t} AS k (scope, operation, key, fingerprint, status, lock_token, locked_until, request_headers,
    attempts, created_at, updated_at, expires_at)
  SELECT $1, $2, $3, $4, 'in_progress', $5::uuid, now() + ${ms('$6')}, $8::jsonb, 1, now(), now(), now() + ${ms('$7')}
  WHERE NOT EXISTS (
    SELECT 1 FROM existing e WHERE NOT e.expired AND (e.fingerprint <> $4
      OR e.status IN ('succeeded', 'failed_permanent') OR (e.status = 'in_progress' AND e.lease_remaining_ms > 0))
  )
  ON CONFLICT (scope, operation, key) DO UPDATE SET
    status = 'in_progress',
    fingerprint = excluded.fingerprint,
    lock_token = excluded.lock_token,
    locked_until = excluded.locked_until,
    request_headers = excluded.request_headers,
    response_status = NULL, response_headers = NULL, response_body = NULL,
    updated_at = now(),
    attempts = CASE WHEN k.expires_at <= now() THEN 1 ELSE k.attempts + 1 END,
    recovery_point = CASE WHEN k.expires_at <= now() THEN NULL ELSE k.recovery_point END,
    created_at = CASE WHEN k.expires_at <= now() THEN now() ELSE k.created_at END,
    expires_at = CASE WHEN k.expires_at <= now() THEN excluded.expires_at
                      ELSE greatest(k.expires_at, excluded.locked_until) END
  WHERE k.expires_at <= now()
     OR (k.fingerprint = excluded.fingerprint
         AND (k.status = 'failed_retryable' OR (k.status = 'in_progress' AND k.locked_until <= now())))
  RETURNING k.attempts, k.recovery_point,
    (extract(epoch FROM (k.expires_at - now())) * 1000)::float8 AS reserved_expires_in_ms
)
SELECT r.attempts IS NOT NULL AS reserved, r.attempts, r.recovery_point, r.reserved_expires_in_ms, e.*,
  set_config('synchronous_commit', 'off', true) AS async_commit
FROM (SELECT 1) AS one LEFT JOIN reserved r ON true LEFT JOIN existing e ON true`,
  )
  return {
    ...prepared,
    values: [id.scope, id.operation, id.key, fingerprint, token, leaseMs, retentionMs, requestHeaders],
  }
}

/** A string as an SQL literal, correct whatever `standard_conforming_strings` is (the same rules as pg's). */
export function literal(value: string): string {
  const quoted = `'${value.replaceAll("'", "''")}'`
  return value.includes('\\') ? ` E${quoted.replaceAll('\\', '\\\\')}` : quoted
}

/** An SQL-level prepared statement: its name, and the PREPARE to send once per connection. */
export interface SqlStatement {
  name: string
  prepare: string
}

/**
 * The reservation and the business transaction's BEGIN in one round trip, as one simple-protocol message:
 * `BEGIN; EXECUTE reserve(...); COMMIT; BEGIN`. The reservation still commits on its own (with synchronous_commit
 * off) before the business transaction starts; the message only saves the BEGIN's round trip. Its statements run in
 * order and stop at the first error, so a failed reservation never begins the business transaction. A simple
 * message cannot carry parameters, so the reservation is an SQL-level prepared statement (`statement.prepare`, sent
 * on its own once per connection; its plan is reused after that) and its arguments are literals: validated integers,
 * and strings quoted by {@link literal}. The caller ends the open transaction (ROLLBACK) when the key was not
 * reserved.
 */
export function reserveAndBegin(
  names: TableNames,
  id: RecordId,
  fingerprint: string,
  token: string,
  leaseMs: number,
  retentionMs: number,
  requestHeaders: Record<string, string> | null,
): { statement: SqlStatement; text: string } {
  if (!Number.isSafeInteger(leaseMs) || !Number.isSafeInteger(retentionMs)) {
    throw new TypeError('Expected `leaseMs` and `retentionMs` to be integers.')
  }
  const statement = sqlStatement(
    names,
    'reserve',
    '(text, text, text, text, uuid, float8, float8, jsonb)',
    () => {
      return reserve(names, id, fingerprint, token, 1, 2, null).text
    },
  )
  const args = [id.scope, id.operation, id.key, fingerprint, token].map(literal)
  const headers = requestHeaders === null ? 'NULL' : literal(JSON.stringify(requestHeaders))
  return {
    statement,
    text: `BEGIN; EXECUTE ${statement.name}(${args.join(', ')}, ${leaseMs}, ${retentionMs}, ${headers}); COMMIT; BEGIN`,
  }
}

export function sqlStatement(
  names: TableNames,
  kind: string,
  types: string,
  build: () => string,
): SqlStatement {
  return once(names, `sql ${kind}`, () => {
    const text = build()
    // SQL-level and protocol-level prepared statements share one namespace per session: a distinct name.
    const name = `oncely_${kind}_${textHash(text)}_sql`
    return { name, prepare: `PREPARE ${name}${types} AS ${text}` }
  })
}

/** The reservation's answer: whether it reserved, and the row as the statement's snapshot saw it (if any). */
export type ReserveRow = {
  reserved: boolean
  attempts: number | null
  recovery_point: string | null
  /** Milliseconds from the statement's `now()` until the reserved row expires (null when not reserved). */
  reserved_expires_in_ms: number | null
} & (LookupRow | { [K in keyof LookupRow]: null })

/** Reads a key that could not be reserved: who holds it, until when, and what it answered. */
export function lookup(names: TableNames, id: RecordId): Query {
  return {
    ...statement(names, 'lookup', () => `SELECT ${LOOKUP_COLUMNS} FROM ${names.qualified} WHERE ${PK}`),
    values: [id.scope, id.operation, id.key],
  }
}

export interface LookupRow {
  fingerprint: string
  status: 'in_progress' | 'succeeded' | 'failed_retryable' | 'failed_permanent'
  expired: boolean
  /** Milliseconds from the statement's `now()` until `expires_at` (negative once expired). */
  expires_in_ms: number
  lease_remaining_ms: number | null
  response_status: number | null
  response_headers: Record<string, string> | null
  response_body: Buffer | null
}

/**
 * The fenced completion: stores the response and finishes the key only while this attempt still holds the lease
 * token. Zero rows means another attempt took over. `fenced: false` exists only for the chaos suite's
 * `unsafe.disableFencing`.
 */
export function complete(
  names: TableNames,
  id: RecordId,
  token: string,
  status: 'succeeded' | 'failed_permanent',
  response: { status: number; headers: Record<string, string>; body: Buffer },
  fenced = true,
): Query {
  const fence = fenced ? ` AND lock_token = $4 AND status = 'in_progress'` : ' AND $4::uuid IS NOT NULL'
  return {
    ...statement(
      names,
      fenced ? 'complete' : 'complete_unfenced',
      () => `UPDATE ${names.qualified} SET status = $5, response_status = $6, response_headers = $7,
  response_body = $8, locked_until = NULL, updated_at = now()
WHERE ${PK}${fence}`,
    ),
    values: [id.scope, id.operation, id.key, token, status, response.status, response.headers, response.body],
  }
}

/**
 * The fenced completion and COMMIT as one simple-protocol message: `EXECUTE complete(...); COMMIT`. When the
 * completion matches no row (another attempt took over), the statement fails on purpose with {@link FENCE_MARKER}
 * (a cast the planner cannot fold), which stops the message before its COMMIT; the caller rolls back. The body
 * travels as a hex literal, so this is for small bodies only (see `INLINE_BODY_BYTES`).
 */
export function completeAndCommit(
  names: TableNames,
  id: RecordId,
  token: string,
  status: 'succeeded' | 'failed_permanent',
  response: { status: number; headers: Record<string, string>; body: Buffer },
  fenced = true,
): { statement: SqlStatement; text: string } {
  if (!Number.isSafeInteger(response.status))
    throw new TypeError('Expected the response status to be an integer.')
  const statement = sqlStatement(
    names,
    fenced ? 'complete' : 'complete_unfenced',
    '(text, text, text, uuid, text, integer, jsonb, bytea)',
    () => `WITH completed AS (
  ${complete(names, id, token, status, response, fenced).text}
  RETURNING 1
)
SELECT (CASE WHEN count(*) = 1 THEN '1' ELSE ${literal(FENCE_MARKER)} END)::int AS completed FROM completed`,
  )
  const args = [
    literal(id.scope),
    literal(id.operation),
    literal(id.key),
    literal(token),
    literal(status),
    String(response.status),
    literal(JSON.stringify(response.headers)),
    `decode('${response.body.toString('hex')}', 'hex')`,
  ]
  return { statement, text: `EXECUTE ${statement.name}(${args.join(', ')}); COMMIT` }
}

/**
 * What makes a fenced statement fail when the key record is no longer this attempt's. The statement casts this text
 * to an integer, so the failure is an ordinary error (SQLSTATE 22P02) that stops a multi-statement message before
 * its COMMIT, and names the cause in the server's log.
 */
/** Bodies up to this size travel as a hex literal with the COMMIT; larger ones as a binary parameter. */
export const INLINE_BODY_BYTES = 32_768

export const FENCE_MARKER = 'oncely: fenced out, the key record changed'

/** True when `error` is a fenced statement failing on purpose (not any other error). */
export function isFenceError(error: unknown): boolean {
  const { code, message } = (error ?? {}) as { code?: unknown; message?: unknown }
  return code === '22P02' && typeof message === 'string' && message.includes(FENCE_MARKER)
}

/** Releases the key after a retryable failure so the next attempt re-executes; fenced like the completion. */
export function release(names: TableNames, id: RecordId, token: string): Query {
  return {
    ...statement(
      names,
      'release',
      () => `UPDATE ${names.qualified} SET status = 'failed_retryable', lock_token = NULL, locked_until = NULL,
  updated_at = now()
WHERE ${PK} AND lock_token = $4 AND status = 'in_progress'`,
    ),
    values: [id.scope, id.operation, id.key, token],
  }
}

/** Records how far a multi-step handler got, committed on its own so it survives a crash; fenced. */
export function saveRecoveryPoint(names: TableNames, id: RecordId, token: string, point: string): Query {
  return {
    text: `UPDATE ${names.qualified} SET recovery_point = $5, updated_at = now()
WHERE ${PK} AND lock_token = $4 AND status = 'in_progress'`,
    values: [id.scope, id.operation, id.key, token, point],
  }
}

/**
 * Deletes up to `batchSize` expired rows. SKIP LOCKED lets several reapers (and reservations reviving an expired
 * key) run at once without waiting on each other; the outer expiry check re-tests rows changed meanwhile.
 */
export function reap(names: TableNames, batchSize: number): Query {
  const t = names.qualified
  return {
    text: `DELETE FROM ${t} WHERE ctid IN (
  SELECT ctid FROM ${t} WHERE expires_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED
) AND expires_at <= now()`,
    values: [batchSize],
  }
}
