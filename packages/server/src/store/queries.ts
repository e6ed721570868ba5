// Every statement the engine sends, as small functions returning { text, values } with $n parameters only. The
// table name is quoted once, in tableNames(); all times come from the database clock (now()).
import type { TableNames } from './identifiers.js'

export interface Query {
  text: string
  values: unknown[]
}

export interface RecordId {
  scope: string
  operation: string
  key: string
}

const PK = 'scope = $1 AND operation = $2 AND key = $3'
const ms = (param: string) => `(${param}::float8 * interval '1 millisecond')`

/**
 * The reservation, one atomic statement: insert the key, or take over a row that is expired, released after a
 * retryable failure, or whose lease ran out. A row with another fingerprint is only replaced once expired, so a
 * mismatch is always reported. Returns no row when the key is held or finished; the caller then reads it.
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
  return {
    text: `WITH previous AS (
  SELECT status, expires_at <= now() AS expired FROM ${t} WHERE ${PK}
)
INSERT INTO ${t} AS k (scope, operation, key, fingerprint, status, lock_token, locked_until, request_headers,
  attempts, created_at, updated_at, expires_at)
VALUES ($1, $2, $3, $4, 'in_progress', $5, now() + ${ms('$6')}, $8, 1, now(), now(), now() + ${ms('$7')})
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
  (SELECT status FROM previous) AS previous_status, (SELECT expired FROM previous) AS previous_expired`,
    values: [id.scope, id.operation, id.key, fingerprint, token, leaseMs, retentionMs, requestHeaders],
  }
}

export interface ReserveRow {
  attempts: number
  recovery_point: string | null
  previous_status: string | null
  previous_expired: boolean | null
}

/** Reads a key that could not be reserved: who holds it, until when, and what it answered. */
export function lookup(names: TableNames, id: RecordId): Query {
  return {
    text: `SELECT fingerprint, status, expires_at <= now() AS expired,
  greatest(0, ceil(extract(epoch FROM (locked_until - now())) * 1000))::float8 AS lease_remaining_ms,
  response_status, response_headers, response_body
FROM ${names.qualified} WHERE ${PK}`,
    values: [id.scope, id.operation, id.key],
  }
}

export interface LookupRow {
  fingerprint: string
  status: 'in_progress' | 'succeeded' | 'failed_retryable' | 'failed_permanent'
  expired: boolean
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
    text: `UPDATE ${names.qualified} SET status = $5, response_status = $6, response_headers = $7,
  response_body = $8, locked_until = NULL, updated_at = now()
WHERE ${PK}${fence}`,
    values: [id.scope, id.operation, id.key, token, status, response.status, response.headers, response.body],
  }
}

/** Releases the key after a retryable failure so the next attempt re-executes; fenced like the completion. */
export function release(names: TableNames, id: RecordId, token: string): Query {
  return {
    text: `UPDATE ${names.qualified} SET status = 'failed_retryable', lock_token = NULL, locked_until = NULL,
  updated_at = now()
WHERE ${PK} AND lock_token = $4 AND status = 'in_progress'`,
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
