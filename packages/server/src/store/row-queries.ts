// The statements of the `reservation: 'row'` protocol (see row-reservation.ts): the key row committed as
// `in_progress` under a lease before the business transaction, and completed in it, fenced on the lock token.
import type { Statement } from './database.js'
import { quoteLiteral, type TableNames } from './identifiers.js'
import * as q from './queries.js'

/** What the reservation stores about the request. */
export interface ReserveArgs {
  fingerprint: string
  token: string
  leaseMs: number
  retentionMs: number
  requestHeaders: Record<string, string> | null
  /** The business transaction's idle limit (the lease; 0 for none). */
  leaseGuardMs: number
}

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
 *
 * The INSERT's condition reads the key's row itself rather than `existing` (one snapshot, so the same row): Citus
 * sends a CTE's result to every worker when an INSERT ... SELECT reads it, which made every tenant's reservation fail
 * while any worker was down. `existing` is MATERIALIZED so that Citus, which runs a statement's CTEs one after the
 * other, still reads the row before the INSERT changes it, as one Postgres does.
 */
function reserveText(names: TableNames): string {
  const t = names.qualified
  return `WITH existing AS MATERIALIZED (
  SELECT ${q.LOOKUP_COLUMNS} FROM ${t} WHERE ${q.PK}
), reserved AS (
  INSERT INTO ${t} AS k (scope, operation, key, fingerprint, status, lock_token, locked_until, request_headers,
    attempts, created_at, updated_at, expires_at)
  SELECT $1, $2, $3, $4, 'in_progress', $5::uuid, now() + ${q.ms('$6')}, $8::jsonb, 1, now(), now(), now() + ${q.ms('$7')}
  WHERE NOT EXISTS (
    SELECT 1 FROM ${t} e WHERE ${q.PK.replaceAll(/(\w+) = /g, 'e.$1 = ')} AND e.expires_at > now() AND (e.fingerprint <> $4
      OR e.status IN ('succeeded', 'failed_permanent') OR (e.status = 'in_progress' AND e.locked_until > now()))
  )
  ON CONFLICT (scope, operation, key) DO UPDATE SET
  ${q.replaceRow({
    status: 'excluded.status',
    attempts: `CASE WHEN k.expires_at <= ${q.UPSERT_NOW} THEN 1 ELSE k.attempts + 1 END`,
    recoveryPoint: q.KEEP_RECOVERY_POINT,
  })}
  WHERE k.expires_at <= ${q.UPSERT_NOW}
     OR (k.fingerprint = excluded.fingerprint
         AND (k.status = 'failed_retryable' OR (k.status = 'in_progress' AND k.locked_until <= ${q.UPSERT_NOW})))
  RETURNING k.attempts, k.recovery_point,
    (extract(epoch FROM (k.expires_at - now())) * 1000)::float8 AS reserved_expires_in_ms
)
SELECT r.attempts IS NOT NULL AS reserved, r.attempts, r.recovery_point, r.reserved_expires_in_ms, e.*,
  set_config('synchronous_commit', 'off', true) AS async_commit, ${q.SERVER}
FROM (SELECT 1) AS one LEFT JOIN reserved r ON true LEFT JOIN existing e ON true`
}

/**
 * The business transaction's lease guard (see q.leaseGuard), as the first statement after its BEGIN. Not worth
 * preparing: it travels with its argument in place.
 */
export function guard(leaseGuardMs: number): Statement {
  return { text: GUARD, types: ['text'], values: [String(leaseGuardMs)] }
}

const GUARD = `SELECT ${q.leaseGuard('$1')}`

/** The reservation's answer: whether it reserved, and the row as the statement's snapshot saw it (if any). */
export type ReserveRow = {
  reserved: boolean
  attempts: number | null
  recovery_point: string | null
  /** Milliseconds from the statement's `now()` until the reserved row expires (null when not reserved). */
  reserved_expires_in_ms: number | null
  /** See SERVER in queries.ts. */
  server: number
} & (Omit<q.LookupRow, 'server'> | { [K in keyof Omit<q.LookupRow, 'server'>]: null })

/** What the completion stores. */
export interface CompleteArgs {
  token: string
  status: 'succeeded' | 'failed_permanent'
  response: { status: number; headers: Record<string, string>; body: Buffer }
}

/**
 * The completion: stores the response and finishes the key, fenced: only while this attempt still holds the lease
 * token. When it matches no row (another attempt took over), it fails on purpose with {@link q.FENCE_MARKER} (a cast
 * the planner cannot fold), so a COMMIT sent after it in the same message never runs; the caller rolls back.
 * Unfenced (only to prove, in the chaos suite, that the fence is what prevents duplicates) it matches the key's row
 * whatever its token.
 */
const completeText = (names: TableNames, fenced: boolean) => `WITH completed AS (
  UPDATE ${names.qualified} SET status = $5, response_status = $6, response_headers = $7,
    response_body = $8, locked_until = NULL, updated_at = now()
  WHERE ${q.PK}${fenced ? ` AND lock_token = $4 AND status = 'in_progress'` : ' AND $4::uuid IS NOT NULL'}
  RETURNING 1
)
SELECT (CASE WHEN count(*) = 1 THEN '1' ELSE ${quoteLiteral(q.FENCE_MARKER)} END)::int AS completed FROM completed`

/** The statements of the row protocol for a table, built once per engine. */
export function rowStatements(names: TableNames, fenced: boolean) {
  const texts = q.statementTexts({
    reserve: {
      types: [...q.ID_TYPES, 'text', 'uuid', 'float8', 'float8', 'jsonb'],
      text: reserveText(names),
    },
    complete: {
      types: [...q.ID_TYPES, 'uuid', 'text', 'integer', 'jsonb', 'bytea'],
      text: completeText(names, fenced),
    },
  })
  return {
    /**
     * The reservation, with its values. The row protocol sends it in a transaction of its own, ahead of the
     * business transaction's BEGIN and its lease guard (a datasource may send the five in one message).
     */
    reserve: (id: q.RecordId, args: ReserveArgs) =>
      q.bind(texts.reserve, [
        ...q.idValues(id),
        args.fingerprint,
        args.token,
        args.leaseMs,
        args.retentionMs,
        q.headersValue(args.requestHeaders),
      ]),
    complete: (id: q.RecordId, args: CompleteArgs) =>
      q.bind(texts.complete, [
        ...q.idValues(id),
        args.token,
        args.status,
        args.response.status,
        JSON.stringify(args.response.headers),
        args.response.body,
      ]),
  }
}

/** What {@link rowStatements} builds. */
export type RowStatements = ReturnType<typeof rowStatements>
