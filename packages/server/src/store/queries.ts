// Every statement the engine sends (store/database.ts): parameterised text with $n parameters only, their values,
// and their types. Each statement has one text, built once when the engine is created (keyStatements() here,
// lockStatements() and rowStatements() for the protocols), and is named after the property that holds it; a request
// only binds values to it. Variants (fenced or not) are compositions of named fragments, never copies. A datasource
// decides how a statement travels (prepared, in one message with BEGIN or COMMIT, or on its own). The table name is
// quoted once, in tableNames(), and a constant embedded in a text once, by quoteLiteral(); all times come from the
// database clock (now()).
import { createHash } from 'node:crypto'
import type { Statement } from './database.js'
import type { TableNames } from './identifiers.js'

/** A statement's text and parameter types, built once, and the name a datasource may prepare it under. */
export interface StatementText {
  readonly name: string
  readonly text: string
  readonly types: readonly string[]
}

const textHash = (text: string) => createHash('sha256').update(text).digest('hex').slice(0, 24)
const snakeCase = (name: string) => name.replaceAll(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)

/**
 * Names each statement `oncely_<its property, in snake_case>_<hash of its text>`. A prepared statement's name must be
 * unique per text on a connection (node-postgres refuses a known name with another text), so the hash is part of
 * it: two stores on different tables, or the unfenced variants, get different names, well under Postgres' 63 bytes.
 */
export function statementTexts<K extends string>(
  specs: Record<K, { text: string; types: readonly string[] }>,
): Record<K, StatementText> {
  const built = {} as Record<K, StatementText>
  for (const kind of Object.keys(specs) as K[]) {
    const { text, types } = specs[kind]
    built[kind] = { name: `oncely_${snakeCase(kind)}_${textHash(text)}`, text, types }
  }
  return built
}

/** A statement built once, with this request's values. */
export function bind(statement: StatementText, values: readonly unknown[]): Statement {
  return { name: statement.name, text: statement.text, types: statement.types, values }
}

/** The three parameters every key statement starts with. */
export const ID_TYPES = ['text', 'text', 'text'] as const

export interface RecordId {
  scope: string
  operation: string
  key: string
}

export const PK = 'scope = $1 AND operation = $2 AND key = $3'

/** The values of {@link ID_TYPES} (and {@link PK}): the id every key statement starts with. */
export const idValues = (id: RecordId): unknown[] => [id.scope, id.operation, id.key]

/** The request headers a route stores, as a jsonb parameter: null when it stores none. */
export const headersValue = (headers: Record<string, string> | null): string | null =>
  headers === null ? null : JSON.stringify(headers)

/**
 * Which server answered: when its postmaster started. A failover, a restore or a restart answers with another
 * value; the replay cache empties then (see ReplayCache.confirm), even when no connection of this process broke (a
 * pooler's survive them).
 */
export const SERVER = 'extract(epoch FROM pg_postmaster_start_time())::float8 AS server'
/** A field a statement reads about a key's row: its name and the SQL expression over the row that computes it. */
export type Field = readonly [name: string, expression: string]

/** What a lookup reads about a key's row ({@link LookupRow}), in order. */
export const LOOKUP_FIELDS = [
  ['fingerprint', 'fingerprint'],
  ['status', 'status'],
  ['expired', 'expires_at <= now()'],
  ['expires_in_ms', '(extract(epoch FROM (expires_at - now())) * 1000)::float8'],
  ['lease_remaining_ms', 'greatest(0, ceil(extract(epoch FROM (locked_until - now())) * 1000))::float8'],
  ['held_ms', '(extract(epoch FROM (now() - updated_at)) * 1000)::float8'],
  ['response_status', 'response_status'],
  ['response_headers', 'response_headers'],
  ['response_body', 'response_body'],
] as const satisfies readonly Field[]

/** `fields` as a select list, each under its name. */
export const columns = (fields: readonly Field[]): string =>
  fields.map(([name, expression]) => (name === expression ? name : `${expression} AS ${name}`)).join(', ')

export const LOOKUP_COLUMNS = columns(LOOKUP_FIELDS)

export const ms = (param: string) => `(${param}::float8 * interval '1 millisecond')`

export interface LookupRow {
  fingerprint: string
  status: 'in_progress' | 'succeeded' | 'failed_retryable' | 'failed_permanent'
  expired: boolean
  /** Milliseconds from the statement's `now()` until `expires_at` (negative once expired). */
  expires_in_ms: number
  lease_remaining_ms: number | null
  /**
   * Milliseconds since the row last changed: for a row in progress, how long its holder has run since it reserved
   * the key or saved its last recovery point (what the 409's `Retry-After` is estimated from).
   */
  held_ms: number
  response_status: number | null
  response_headers: Record<string, string> | null
  // A Buffer from node-postgres, a plain Uint8Array from PGlite or postgres.js: read it through asBuffer() (engine/answers.ts).
  response_body: Uint8Array | null
  /**
   * See {@link SERVER}: selected by the lookup and the reservation; the lock protocol's lookup takes it from the
   * lock statement sent with it (one server answered both).
   */
  server: number
}

/**
 * What makes a fenced statement fail when the key record is no longer this attempt's. The statement casts this text
 * to an integer, so the failure is an ordinary error (SQLSTATE 22P02) that stops a multi-statement message before
 * its COMMIT, and names the cause in the server's log.
 */
export const FENCE_MARKER = 'oncely: fenced out, the key record changed'

/** True when `error` is a fenced statement failing on purpose (not any other error). */
export function isFenceError(error: unknown): boolean {
  const { code, message } = (error ?? {}) as { code?: unknown; message?: unknown }
  return code === '22P02' && typeof message === 'string' && message.includes(FENCE_MARKER)
}

/**
 * What an upsert's DO UPDATE clause uses for `now()`: the proposed row's `updated_at`, which every INSERT of the
 * engine sets to `now()`, so the value is the same. Citus refuses any function that is not IMMUTABLE in the DO UPDATE
 * SET and WHERE of an INSERT into a distributed table (it evaluates stable functions once, before sending the
 * statement to the shard, and cannot do so in a clause it only runs there); a column of `excluded` it accepts.
 */
export const UPSERT_NOW = 'excluded.updated_at'

/**
 * The SET list of an upsert that makes an existing row `k` into the row its INSERT proposed (`excluded`): the
 * reservation, the lock protocol's first recovery point and its finished record all replace a row this way, so the
 * rules live here once. A row that had expired starts over (new `created_at` and expiry); a live one keeps its
 * history and its first expiry, extended when needed to outlive the new lease. `status`, `attempts` and
 * `recovery_point` are what differs between the three, as SQL over `k` and `excluded`; the time is
 * {@link UPSERT_NOW}.
 */
export function replaceRow(set: { status: string; attempts: string; recoveryPoint: string }): string {
  const now = UPSERT_NOW
  return `status = ${set.status},
  fingerprint = excluded.fingerprint,
  lock_token = excluded.lock_token,
  locked_until = excluded.locked_until,
  request_headers = excluded.request_headers,
  response_status = excluded.response_status,
  response_headers = excluded.response_headers,
  response_body = excluded.response_body,
  updated_at = ${now},
  attempts = ${set.attempts},
  recovery_point = ${set.recoveryPoint},
  created_at = CASE WHEN k.expires_at <= ${now} THEN excluded.created_at ELSE k.created_at END,
  expires_at = CASE WHEN k.expires_at <= ${now} THEN excluded.expires_at
                    ELSE greatest(k.expires_at, excluded.locked_until) END`
}

/** A live row keeps the recovery point an earlier attempt saved; an expired one starts without. */
export const KEEP_RECOVERY_POINT = `CASE WHEN k.expires_at <= ${UPSERT_NOW} THEN NULL ELSE k.recovery_point END`

/**
 * Bounds how long the attempt's transaction may sit idle: Postgres ends the session of a holder that stopped while
 * alive (a paused process, a long GC, a handler hung between statements) once it was idle for the lease, so its
 * locks are freed and its late COMMIT cannot land. A handler busy in a statement is not idle and keeps its key.
 * Transaction-local, so the connection goes back to the pool unchanged. A lease of 0 turns the guard off (only for
 * the unfenced engine that proves the chaos checker sees duplicates).
 */
export const leaseGuard = (leaseMs: string) =>
  `set_config('idle_in_transaction_session_timeout', ${leaseMs}, true)`

/**
 * True when Postgres ended the session because the transaction sat idle past the lease guard: the attempt's
 * transaction is gone (rolled back), and with it its hold on the key.
 *
 * On Citus, also when the coordinator reports that the transaction's connection to the worker holding the key's
 * shard ended (08006, "connection to the remote node ..."): under the lock protocol the lease guard is armed on that
 * worker (the statement that arms it runs there, with the key's lock), so this is how a lapsed lease reaches the
 * attempt; a worker's restart reads the same. Either way the worker's part of the transaction is gone.
 */
export function isLeaseLost(error: unknown): boolean {
  const { code, message } = (error ?? {}) as { code?: unknown; message?: unknown }
  if (code === '25P03') return true
  return (
    code === '08006' && typeof message === 'string' && message.startsWith('connection to the remote node')
  )
}

/** The statements both protocols send about a key, built once per engine. */
export function keyStatements(names: TableNames) {
  const t = names.qualified
  const texts = statementTexts({
    lookup: { types: ID_TYPES, text: `SELECT ${LOOKUP_COLUMNS}, ${SERVER} FROM ${t} WHERE ${PK}` },
    release: {
      types: [...ID_TYPES, 'uuid'],
      text: `UPDATE ${t} SET status = 'failed_retryable', lock_token = NULL, locked_until = NULL,
  updated_at = now()
WHERE ${PK} AND lock_token = $4 AND status = 'in_progress'`,
    },
    renew: {
      types: [...ID_TYPES, 'uuid', 'float8'],
      text: `UPDATE ${t} SET locked_until = now() + ${ms('$5')},
  expires_at = greatest(expires_at, now() + ${ms('$5')})
WHERE ${PK} AND lock_token = $4 AND status = 'in_progress' AND locked_until > now()`,
    },
    saveRecoveryPoint: {
      types: [...ID_TYPES, 'uuid', 'text'],
      text: `UPDATE ${t} SET recovery_point = $5, updated_at = now()
WHERE ${PK} AND lock_token = $4 AND status = 'in_progress'`,
    },
  })
  return {
    /** Reads a key that could not be reserved: who holds it, until when, and what it answered. */
    lookup: (id: RecordId) => bind(texts.lookup, idValues(id)),
    /** Releases the key after a retryable failure so the next attempt re-executes; fenced like the completion. */
    release: (id: RecordId, token: string) => bind(texts.release, [...idValues(id), token]),
    /**
     * Extends the lease of a key this attempt still holds (fenced on its token), committed on its own: a live holder
     * renews while its handler runs, so only one that stopped lets its lease run out. A lease that already ran out
     * is not revived (a renewal sent before a stall can arrive after it, when another attempt is entitled to the
     * key). The expiry is pushed out too when the lease would outlive it. Zero rows: the key is no longer ours.
     */
    renew: (id: RecordId, token: string, leaseMs: number) =>
      bind(texts.renew, [...idValues(id), token, leaseMs]),
    /** Records how far a multi-step handler got (row protocol); fenced on the token. */
    saveRecoveryPoint: (id: RecordId, token: string, point: string) =>
      bind(texts.saveRecoveryPoint, [...idValues(id), token, point]),
  }
}

/** What {@link keyStatements} builds. */
export type KeyStatements = ReturnType<typeof keyStatements>

/** Deletes a key record whatever its state, so the key is new again (`engine.forget`). */
export function forget(names: TableNames, id: RecordId): Statement {
  return { text: `DELETE FROM ${names.qualified} WHERE ${PK}`, values: idValues(id) }
}

/**
 * Deletes up to `batchSize` expired rows. SKIP LOCKED lets several reapers (and reservations reviving an expired
 * key) run at once without waiting on each other; the outer expiry check re-tests rows changed meanwhile.
 */
export function reap(names: TableNames, batchSize: number): Statement {
  return { text: reapText(names.qualified, '$1'), values: [batchSize] }
}

/** The reaper's statement on `table` (a qualified name, or a shard's), deleting up to `limit` (SQL) rows. */
export function reapText(table: string, limit: string): string {
  return `DELETE FROM ${table} WHERE ctid IN (
  SELECT ctid FROM ${table} WHERE expires_at <= now() LIMIT ${limit} FOR UPDATE SKIP LOCKED
) AND expires_at <= now()`
}
