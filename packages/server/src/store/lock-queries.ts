// The statements of the `reservation: 'lock'` protocol (see lock-reservation.ts): a transaction-scoped advisory
// lock on the key, the key's row read after it, and the finished record written as one fenced upsert just before
// COMMIT (a datasource may send the lock and the lookup with their BEGIN, and the finish with its COMMIT, in one
// message each).
//
// The statements of a first execution are written for what Postgres does on every execution of a prepared
// statement, which a new key pays in full: it sets up every function call of the statement (looked up and
// initialised per execution, whether a row comes back or not). So the lock's key is hashed from one parameter built
// here, the lookup reads the row as one `to_json` whose fields are derived here, and the join that routes the lock
// to a tenant's shard is sent only where the key table can be distributed (Citus).
import { isUniqueViolation } from '../backstop.js'
import { quoteLiteral, type TableNames } from './identifiers.js'
import {
  bind,
  FENCE_MARKER,
  headersValue,
  ID_TYPES,
  idValues,
  KEEP_RECOVERY_POINT,
  type LookupRow,
  leaseGuard,
  ms,
  PK,
  type RecordId,
  replaceRow,
  SERVER,
  statementTexts,
} from './queries.js'

/** Characters of `text` as Postgres' `length()` counts them: code points, a surrogate pair being one. */
function characters(text: string): number {
  let count = text.length
  for (let i = 0; i < text.length - 1; i++) {
    const unit = text.charCodeAt(i)
    if (unit >= 0xd800 && unit <= 0xdbff) {
      const next = text.charCodeAt(i + 1)
      if (next >= 0xdc00 && next <= 0xdfff) {
        count--
        i++
      }
    }
  }
  return count
}

/**
 * The text whose 64-bit hash (`hashtextextended(text, 0)`) is the key's advisory lock: the table, the scope and the
 * operation, each length-prefixed so no two triples share a text, and the key. Every version of oncely must lock a
 * key under the same text, or two versions running side by side would both run it: this is exactly the text earlier
 * versions built in SQL, `'"schema"."table"|' || length($1) || ':' || $1 || '|' || length($2) || ':' || $2 || '|' ||
 * $3` (held by test/lock-text.test.ts). Built here, as one parameter, because as that expression it cost the lock
 * statement ten function calls set up on every execution, about as much as the rest of the reservation.
 */
export function lockText(names: TableNames, id: RecordId): string {
  return `${names.qualified}|${characters(id.scope)}:${id.scope}|${characters(id.operation)}:${id.operation}|${id.key}`
}

/** The key's advisory lock, of the {@link lockText} in parameter `text`. */
const lockKey = (text: string) => `hashtextextended(${text}, 0)`

/**
 * A FROM clause that names the key's row but reads nothing of it (`LIMIT 0`): one row, whatever is stored. On Citus a
 * statement with no table runs on the node the session is connected to; with this one it runs whole on the node
 * holding the key's shard, so the lock and the lease guard are taken there, the one node every attempt on the key
 * reaches, whichever node its session is on. On one Postgres it would cost every reservation a join, a scan and an
 * index opened and closed for nothing, so the lock statement carries it only where Citus is installed (see
 * {@link LockStatements.lock}); the statements that are not on a first execution's path always do.
 */
const onKeysShard = (names: TableNames) =>
  `FROM (SELECT 1) AS one LEFT JOIN (SELECT 1 FROM ${names.qualified}
  WHERE ${PK} LIMIT 0) AS on_keys_shard ON true`

/**
 * The key's row as one JSON text (`to_json` of the row: every column, timestamps in ISO 8601 whatever the session's
 * DateStyle), or no row; with the transaction's `now()`, which the row's times are measured against (see
 * {@link lockedRowOf}). One function call to set up, where computing the fields in SQL cost a new key, which has no
 * row, a dozen.
 */
const ROW_JSON = 'to_json(k)::text AS r'
const NOW_JSON = 'to_json(now())::text AS now'

/** The key's row as the lookup and the inspection send it: see {@link ROW_JSON}. */
export interface RowJson {
  r: string | null
  /** The transaction's `now()`, as a JSON string. */
  now: string
}

/** A row of the key table as `to_json` writes it. */
interface KeyRowJson {
  fingerprint: string
  status: LookupRow['status']
  lock_token: string | null
  locked_until: string | null
  response_status: number | null
  response_headers: Record<string, string> | null
  response_body: string | null
  recovery_point: string | null
  attempts: number
  updated_at: string
  expires_at: string
}

const TIMESTAMP =
  /^(-?\d{4,})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?$/

/**
 * Milliseconds since the epoch, to the microsecond, of a timestamp as Postgres writes it in JSON
 * (`2026-12-07T04:50:48.099123+01:00`); throws on anything else.
 */
export function timestampMs(text: string): number {
  const m = TIMESTAMP.exec(text)
  if (!m) throw new Error(`oncely: unexpected timestamp from Postgres: ${JSON.stringify(text)}`)
  const utc = Date.UTC(+m[1]!, +m[2]! - 1, +m[3]!, +m[4]!, +m[5]!, +m[6]!)
  const micros = m[7] ? Number(m[7].padEnd(6, '0')) : 0
  const offsetMs = m[8]
    ? (m[8] === '-' ? -1 : 1) * ((+m[9]! * 60 + +(m[10] ?? 0)) * 60 + +(m[11] ?? 0)) * 1000
    : 0
  return utc + micros / 1000 - offsetMs
}

/** A bytea as Postgres writes it in text, in either `bytea_output` format (`\x` and hex, or escaped). */
export function byteaOf(text: string): Buffer {
  if (text.startsWith('\\x')) return Buffer.from(text.slice(2), 'hex')
  const bytes: number[] = []
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i)
    if (code !== 0x5c) bytes.push(code)
    else if (text[i + 1] === '\\') {
      bytes.push(0x5c)
      i++
    } else {
      bytes.push(Number.parseInt(text.slice(i + 1, i + 4), 8))
      i += 3
    }
  }
  return Buffer.from(bytes)
}

/**
 * The row of a {@link ROW_JSON} answer, with the fields the lookup of both protocols reads, derived as the row
 * protocol's SQL derives them ({@link LOOKUP_FIELDS}): times against the transaction's `now()`, so no clock of this
 * process enters; undefined when the key has no row.
 */
export function lockedRowOf(answer: RowJson | undefined, server: number): LockedLookupRow | undefined {
  if (answer?.r == null) return undefined
  const row = JSON.parse(answer.r) as KeyRowJson
  const now = timestampMs(JSON.parse(answer.now) as string)
  const expiresAt = timestampMs(row.expires_at)
  return {
    fingerprint: row.fingerprint,
    status: row.status,
    expired: expiresAt <= now,
    expires_in_ms: expiresAt - now,
    // greatest(0, ...) in SQL, which also makes a row without a lease 0.
    lease_remaining_ms:
      row.locked_until === null ? 0 : Math.max(0, Math.ceil(timestampMs(row.locked_until) - now)),
    held_ms: now - timestampMs(row.updated_at),
    response_status: row.response_status,
    response_headers: row.response_headers,
    response_body: row.response_body === null ? null : byteaOf(row.response_body),
    server,
    attempts: row.attempts,
    recovery_point: row.recovery_point,
    lock_token: row.lock_token,
    // Sent back as a timestamptz parameter to fence the finish: `to_json` keeps every microsecond of it.
    version: row.updated_at,
  }
}

/**
 * The key's advisory lock as pg_locks lists it, granted to someone: Postgres shows a bigint advisory lock as its
 * high and low 32 bits (`classid`, `objid`) with `objsubid` 1. The database's oid comes from this session's own
 * activity row rather than from pg_database: on Citus a statement that reads a catalog table is planned apart from
 * the key's shard, and would read pg_locks on the coordinator, where the lock is not.
 */
const heldLock = (text: string) => `pg_locks l, (SELECT ${lockKey(text)} AS h) AS k
  WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
    AND l.database = (SELECT datid FROM pg_stat_get_activity(pg_backend_pid()))
    AND l.classid = ((k.h >> 32) & 4294967295)::oid AND l.objid = (k.h & 4294967295)::oid`

/**
 * How long the holder of the key's lock has been in its transaction, from pg_stat_activity (null when nobody holds
 * it, or when this role may not see the holder's session): what a duplicate's `Retry-After` is estimated from. The
 * view's function rather than the view, which joins catalog tables (see {@link heldLock}).
 */
const holderMs = (
  text: string,
) => `(SELECT (extract(epoch FROM (clock_timestamp() - min(a.xact_start))) * 1000)::float8
  FROM pg_stat_get_activity(NULL) a, ${heldLock(text)} AND a.pid = l.pid) AS holder_ms`

/**
 * Which row versions an attempt may replace: the one it saw after taking the lock, or one carrying its own token
 * (written by its own recovery point). As SQL over `k` (the existing row), with the seen version and status, and
 * the token, as parameters.
 */
const ours = (version: string, status: string, token: string) =>
  `((k.updated_at = ${version}::timestamptz AND k.status = ${status}) OR (k.lock_token = ${token}::uuid AND k.status = 'in_progress'))`

/** The unfenced finish's stand-in for {@link ours}: always true, using the same parameters so the types hold. */
const ANY_ROW = '$10::timestamptz IS NULL OR $11::text IS NULL OR $14::uuid IS NULL OR true'

/** What a finish writes into the columns that differ between its statements, as SQL (a parameter or a constant). */
interface FinishedValues {
  status: string
  requestHeaders: string
  responseStatus: string
  responseHeaders: string
  responseBody: string
  /** An interval: {@link retentionInterval}. */
  retention: string
  attempt: string
}

/** The finished record's columns and values, the same for each INSERT of a finish and for the upsert. */
const finishedRow = (names: TableNames, v: FinishedValues) =>
  `INTO ${names.qualified} AS k (scope, operation, key, fingerprint, status, request_headers, response_status,
  response_headers, response_body, attempts, created_at, updated_at, expires_at)
VALUES ($1, $2, $3, $4, ${v.status}, ${v.requestHeaders}::jsonb, ${v.responseStatus}, ${v.responseHeaders}::jsonb,
  ${v.responseBody}::bytea, ${v.attempt}, now(), now(), now() + ${v.retention}::interval)`

/** The record's values as parameters $5 to $9 (see {@link RECORD_TYPES}), then the retention's and the attempt's. */
const RECORD_VALUES = (retention: string, attempt: string): FinishedValues => ({
  status: '$5',
  responseStatus: '$6',
  responseHeaders: '$7',
  responseBody: '$8',
  requestHeaders: '$9',
  retention,
  attempt,
})

/**
 * A retention as the finish's interval parameter. An interval the statement reads as it is costs Postgres less per
 * execution than milliseconds it multiplies into one.
 */
const retentionInterval = (retentionMs: number) => `${retentionMs} milliseconds`

/**
 * The finished record of a key the attempt found absent, as a plain INSERT. The attempt holds the key's lock, so
 * no attempt of this protocol can have written the row since; a unique violation on the primary key means another
 * writer did (an attempt of the row protocol), and is read as fenced out (see {@link isFinishConflict}): the
 * transaction, business writes included, is rolled back. No ON CONFLICT clause: its arbiter check costs every new
 * key a second look at the index.
 */
// A key found absent is on its first attempt (see lock-reservation.ts, claimOf): `attempts` is 1, not a parameter.
const insertFinishedText = (names: TableNames) => `INSERT ${finishedRow(names, RECORD_VALUES('$10', '1'))}`

/**
 * {@link insertFinishedText} for the finish of nearly every first execution: a success, with no request headers to
 * store. Each parameter of a prepared statement costs Postgres its own parsing and conversion on every execution;
 * these two are constants here.
 */
const insertSucceededText = (names: TableNames) =>
  `INSERT ${finishedRow(names, {
    status: "'succeeded'",
    requestHeaders: 'NULL',
    responseStatus: '$5',
    responseHeaders: '$6',
    responseBody: '$7',
    retention: '$8',
    attempt: '1',
  })}`

/**
 * The finished record over a row the attempt saw, as one upsert, fenced: it replaces only the row version this
 * attempt saw (an expired, released or abandoned record it took over) or the one its own recovery point wrote. When
 * anything else happened to the row meanwhile (another protocol's reservation, a late completion by an attempt whose
 * lease ran out), the statement fails with {@link FENCE_MARKER} and the transaction, business writes included, is
 * rolled back. A key that was not expired keeps its first expiry, as in the row protocol.
 *
 * The failure is a cast of a text that depends on the row, so the planner cannot fold it into a constant (and fail
 * at PREPARE); an upsert with a WHERE clause would instead report zero rows, which would take a round trip to
 * inspect before the COMMIT.
 */
const finishText = (names: TableNames, fenced: boolean) =>
  `INSERT ${finishedRow(names, RECORD_VALUES('$12', '$13'))}
ON CONFLICT (scope, operation, key) DO UPDATE SET
  ${replaceRow({
    status: `CASE WHEN ${fenced ? ours('$10', '$11', '$14') : ANY_ROW} THEN excluded.status ELSE (k.status || ${quoteLiteral(` ${FENCE_MARKER}`)})::int::text END`,
    attempts: 'excluded.attempts',
    recoveryPoint: KEEP_RECOVERY_POINT,
  })}`

/** The finished record's parameters: the id, fingerprint, status, response, request headers. */
const RECORD_TYPES = [...ID_TYPES, 'text', 'text', 'integer', 'jsonb', 'bytea', 'jsonb']
const INSERT_TYPES = [...RECORD_TYPES, 'interval']
const SUCCEEDED_TYPES = [...ID_TYPES, 'text', 'integer', 'jsonb', 'bytea', 'interval']
// The seen version ($10) is a timestamptz parameter rather than a text cast in the statement: Citus refuses a cast
// that is not IMMUTABLE (text to timestamptz depends on the time zone) in the DO UPDATE clause.
const FINISH_TYPES = [...RECORD_TYPES, 'timestamptz', 'text', 'interval', 'integer', 'uuid']

/**
 * The statements of the lock protocol for a table, built once per engine; `fenced: false` (only to prove, in the
 * chaos suite, that the fence is what prevents duplicates) finishes every key with an upsert that replaces any row.
 */
export function lockStatements(names: TableNames, fenced: boolean) {
  const texts = statementTexts({
    /**
     * The advisory lock, transaction-scoped, so it ends with the business transaction whatever happens to the
     * process. A collision of two in-flight keys only answers one of them 409. The same statement arms the lease
     * guard ({@link leaseGuard}, the lease in milliseconds as `$2`), the key's {@link lockText} being `$1`: the transaction, and so the lock, cannot outlive
     * a holder that stopped while alive by more than the lease. `locked` is true only when both ran (an AND is true
     * only once both sides were evaluated, in whichever order); a lock not granted needs no guard.
     *
     * The key's row is read by the next statement (`lockedLookup`), never by this one: a statement reads with the
     * snapshot taken when it started, before its lock was granted, so it can miss the record of a holder that
     * committed (and so let go of the lock) in between, and run the handler a second time. The next statement's
     * snapshot is taken after the lock was granted: it sees every commit of whoever held the lock before.
     */
    lock: {
      types: ['text', 'text'],
      text: `SELECT pg_try_advisory_xact_lock(${lockKey('$1')}) AND ${leaseGuard('$2')} IS NOT NULL AS locked, ${SERVER}`,
    },
    /** {@link lock} run on the node that holds the key's shard (see {@link onKeysShard}): the same lock. */
    lockOnShard: {
      types: [...ID_TYPES, 'text', 'text'],
      text: `SELECT pg_try_advisory_xact_lock(${lockKey('$4')}) AND ${leaseGuard('$5')} IS NOT NULL AS locked, ${SERVER}
${onKeysShard(names)}`,
    },
    lockedLookup: {
      types: ID_TYPES,
      text: `SELECT ${ROW_JSON}, ${NOW_JSON} FROM ${names.qualified} AS k WHERE ${PK}`,
    },
    /**
     * Whether another attempt holds the key's lock (and since when), and the key's row, without taking the lock: a
     * probe that took it, even for one statement, could make a real attempt fail to get it and answer 409 for
     * nothing.
     */
    inspect: {
      types: [...ID_TYPES, 'text'],
      text: `SELECT EXISTS (SELECT 1 FROM ${heldLock('$4')}) AS held, ${holderMs('$4')}, e.r, ${NOW_JSON}, ${SERVER}
FROM (SELECT 1) AS one LEFT JOIN (SELECT ${ROW_JSON} FROM ${names.qualified} AS k WHERE ${PK}) AS e ON true`,
    },
    /** How long the holder of a key's lock has held it, asked by a duplicate that did not get the lock. */
    holder: { types: [...ID_TYPES, 'text'], text: `SELECT ${holderMs('$4')} ${onKeysShard(names)}` },
    insertFinished: { types: INSERT_TYPES, text: insertFinishedText(names) },
    insertSucceeded: { types: SUCCEEDED_TYPES, text: insertSucceededText(names) },
    finish: { types: FINISH_TYPES, text: finishText(names, fenced) },
    saveRecoveryPoint: { types: SAVE_TYPES, text: saveRecoveryPointText(names) },
  })
  return {
    /**
     * The key's lock with the lease guard armed (see {@link texts.lock}), `onShard` where the key table may be
     * distributed (Citus installed): there the statement must run on the node holding the key's shard.
     */
    lock: (id: RecordId, leaseGuardMs: number, onShard: boolean) =>
      onShard
        ? bind(texts.lockOnShard, [...idValues(id), lockText(names, id), String(leaseGuardMs)])
        : bind(texts.lock, [lockText(names, id), String(leaseGuardMs)]),
    lockedLookup: (id: RecordId) => bind(texts.lockedLookup, idValues(id)),
    inspect: (id: RecordId) => bind(texts.inspect, [...idValues(id), lockText(names, id)]),
    holder: (id: RecordId) => bind(texts.holder, [...idValues(id), lockText(names, id)]),
    /**
     * The finished record, sent last before the COMMIT: a plain INSERT when the attempt found no row and wrote none
     * (no recovery point), the fenced upsert otherwise (or always, unfenced).
     */
    finish(id: RecordId, record: FinishRecord) {
      const fresh = fenced && record.seen === null && record.token === null
      if (fresh && record.status === 'succeeded' && record.requestHeaders === null) {
        const { response } = record
        return bind(texts.insertSucceeded, [
          id.scope,
          id.operation,
          id.key,
          record.fingerprint,
          response.status,
          JSON.stringify(response.headers),
          response.body,
          retentionInterval(record.retentionMs),
        ])
      }
      const values = recordValues(id, record)
      if (fresh) {
        values.push(retentionInterval(record.retentionMs))
        return bind(texts.insertFinished, values)
      }
      values.push(
        record.seen?.version ?? null,
        record.seen?.status ?? null,
        retentionInterval(record.retentionMs),
        record.attempt,
        record.token ?? NO_TOKEN,
      )
      return bind(texts.finish, values)
    },
    saveRecoveryPoint: (id: RecordId, save: LockedRecoveryPoint) =>
      bind(texts.saveRecoveryPoint, saveValues(id, save)),
  }
}

/** What {@link lockStatements} builds. */
export type LockStatements = ReturnType<typeof lockStatements>

/**
 * True when `error` is the plain INSERT of a finished record meeting a row another writer inserted meanwhile (a
 * unique violation on the key table's primary key, SQLSTATE 23505): the attempt is fenced out. A violation of any
 * other constraint (a business table's, or a deferred one at COMMIT) is not.
 */
export function isFinishConflict(names: TableNames, error: unknown): boolean {
  return isUniqueViolation(error, names.primaryKey)
}

/** The inspection's answer: whether the lock is held (and since when), and the key's row (see {@link ROW_JSON}). */
export interface InspectedLock extends RowJson {
  held: boolean
  holder_ms: number | null
  server: number
}

/** The lock statement's answer: whether the lock was granted (and the lease guard armed). */
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

/** What the finish stores. */
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
  /**
   * This attempt's token, once its first recovery point wrote a row carrying it (see {@link saveRecoveryPoint}), and
   * null before: the finish then replaces that row instead of inserting.
   */
  token: string | null
}

/** A uuid no row carries: the finish's token parameter when the attempt saved no recovery point. */
const NO_TOKEN = '00000000-0000-0000-0000-000000000000'

/** The values of {@link RECORD_TYPES}. */
function recordValues(id: RecordId, record: FinishRecord): unknown[] {
  return [
    id.scope,
    id.operation,
    id.key,
    record.fingerprint,
    record.status,
    record.response.status,
    JSON.stringify(record.response.headers),
    record.response.body,
    headersValue(record.requestHeaders),
  ]
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
const saveRecoveryPointText = (
  names: TableNames,
) => `INSERT INTO ${names.qualified} AS k (scope, operation, key,
  fingerprint, status, lock_token, locked_until, request_headers, recovery_point, attempts, created_at, updated_at,
  expires_at)
VALUES ($1, $2, $3, $4, 'in_progress', $5::uuid, now() + ${ms('$6')}, $7::jsonb, $8, $9, now(), now(),
  now() + ${ms('$10')})
ON CONFLICT (scope, operation, key) DO UPDATE SET
  ${replaceRow({ status: 'excluded.status', attempts: 'excluded.attempts', recoveryPoint: 'excluded.recovery_point' })}
WHERE ${ours('$11', '$12', '$5')}`

const SAVE_TYPES = [
  ...ID_TYPES,
  'text',
  'uuid',
  'float8',
  'jsonb',
  'text',
  'integer',
  'float8',
  'timestamptz',
  'text',
]

function saveValues(id: RecordId, save: LockedRecoveryPoint): unknown[] {
  return [
    ...idValues(id),
    save.fingerprint,
    save.token,
    save.leaseMs,
    headersValue(save.requestHeaders),
    save.point,
    save.attempt,
    save.retentionMs,
    save.seen?.version ?? null,
    save.seen?.status ?? null,
  ]
}
