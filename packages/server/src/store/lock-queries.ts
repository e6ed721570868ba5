// The statements of the `reservation: 'lock'` protocol (see lock-reservation.ts): a transaction-scoped advisory
// lock on the key, the key's row read after it, and the finished record written as one fenced upsert just before
// COMMIT (a datasource may send the lock and the lookup with their BEGIN, and the finish with its COMMIT, in one
// message each).
import { isUniqueViolation } from '../backstop.js'
import { quoteLiteral, type TableNames } from './identifiers.js'
import {
  bind,
  columns,
  FENCE_MARKER,
  type Field,
  headersValue,
  ID_TYPES,
  idValues,
  KEEP_RECOVERY_POINT,
  LOOKUP_FIELDS,
  type LookupRow,
  leaseGuard,
  ms,
  PK,
  type RecordId,
  replaceRow,
  SERVER,
  statementTexts,
} from './queries.js'

/**
 * The key's advisory lock: a 64-bit hash of the table, scope ($1), operation ($2) and key ($3), length-prefixed so
 * no two triples share a text. Every version of oncely must hash the same text, or two of them would run one key.
 */
const lockKey = (names: TableNames) =>
  `hashtextextended(${quoteLiteral(`${names.qualified}|`)} || length($1) || ':' || $1 || '|' || length($2) || ':' || $2 || '|' || $3, 0)`

/**
 * A FROM clause that names the key's row but reads nothing of it (`LIMIT 0`): one row, whatever is stored. On Citus a
 * statement with no table runs on the node the session is connected to; with this one it runs whole on the node
 * holding the key's shard, so the lock and the lease guard are taken there, the one node every attempt on the key
 * reaches, whichever node its session is on. On one Postgres it costs a plan node that is never run.
 */
const onKeysShard = (names: TableNames) =>
  `FROM (SELECT 1) AS one LEFT JOIN (SELECT 1 FROM ${names.qualified}
  WHERE ${PK} LIMIT 0) AS on_keys_shard ON true`

/** What the lock protocol reads about a key's row; `version` identifies the row version for the finishing fence. */
const LOCKED_FIELDS = [
  ...LOOKUP_FIELDS,
  ['attempts', 'attempts'],
  ['recovery_point', 'recovery_point'],
  ['lock_token', 'lock_token::text'],
  ['version', 'updated_at::text'],
] as const satisfies readonly Field[]

/** The key's row as the lock protocol reads it. */
const lockedRow = (names: TableNames) =>
  `SELECT ${columns(LOCKED_FIELDS)} FROM ${names.qualified} WHERE ${PK}`

/**
 * The key's row as the lock protocol's lookup sends it: one text column holding a JSON array of
 * {@link LOCKED_FIELDS}' values, in order (the body as base64), or no row. A row description costs a new key, which
 * has no row, as much as a found one: thirteen field descriptors (about 240 bytes) sent and parsed per request,
 * against one. Text, not json, so that every datasource hands it over alike, to be read by {@link unpackLockedRow}.
 */
const packedLockedRow = (names: TableNames) =>
  `SELECT json_build_array(${LOCKED_FIELDS.map(([name, expression]) =>
    name === 'response_body' ? `encode(${expression}, 'base64')` : expression,
  ).join(', ')})::text AS r
  FROM ${names.qualified} WHERE ${PK}`

/** The field names of {@link packedLockedRow}'s array, in order. */
const PACKED_FIELDS = LOCKED_FIELDS.map(([name]) => name)

/** The row of {@link packedLockedRow} (its `r` column), or undefined when the key has none. */
export function unpackLockedRow(
  packed: { r: string } | undefined,
  server: number,
): LockedLookupRow | undefined {
  if (packed === undefined) return undefined
  const values = JSON.parse(packed.r) as unknown[]
  const row: Record<string, unknown> = { server }
  for (let i = 0; i < PACKED_FIELDS.length; i++) row[PACKED_FIELDS[i]!] = values[i] ?? null
  const body = row.response_body
  row.response_body = typeof body === 'string' ? Buffer.from(body, 'base64') : null
  return row as unknown as LockedLookupRow
}

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
 * Which row versions an attempt may replace: the one it saw after taking the lock, or one carrying its own token
 * (written by its own recovery point). As SQL over `k` (the existing row), with the seen version and status, and
 * the token, as parameters.
 */
const ours = (version: string, status: string, token: string) =>
  `((k.updated_at = ${version}::timestamptz AND k.status = ${status}) OR (k.lock_token = ${token}::uuid AND k.status = 'in_progress'))`

/** The unfenced finish's stand-in for {@link ours}: always true, using the same parameters so the types hold. */
const ANY_ROW = '$10::timestamptz IS NULL OR $11::text IS NULL OR $14::uuid IS NULL OR true'

/**
 * The finished record's columns and values, the same for the plain INSERT and the upsert, with the parameters of
 * the retention and the attempt's number (which follow the seen version and status in the upsert's).
 */
const finishedRow = (names: TableNames, retention: string, attempt: string) =>
  `INTO ${names.qualified} AS k (scope, operation, key, fingerprint, status, request_headers, response_status,
  response_headers, response_body, attempts, created_at, updated_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $9::jsonb, $6, $7::jsonb, $8::bytea, ${attempt}, now(), now(), now() + ${ms(retention)})`

/**
 * The finished record of a key the attempt found absent, as a plain INSERT. The attempt holds the key's lock, so
 * no attempt of this protocol can have written the row since; a unique violation on the primary key means another
 * writer did (an attempt of the row protocol), and is read as fenced out (see {@link isFinishConflict}): the
 * transaction, business writes included, is rolled back. No ON CONFLICT clause: its arbiter check costs every new
 * key a second look at the index.
 */
const insertFinishedText = (names: TableNames) => `INSERT ${finishedRow(names, '$10', '$11')}`

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
  `INSERT ${finishedRow(names, '$12', '$13')}
ON CONFLICT (scope, operation, key) DO UPDATE SET
  ${replaceRow({
    status: `CASE WHEN ${fenced ? ours('$10', '$11', '$14') : ANY_ROW} THEN excluded.status ELSE (k.status || ${quoteLiteral(` ${FENCE_MARKER}`)})::int::text END`,
    attempts: 'excluded.attempts',
    recoveryPoint: KEEP_RECOVERY_POINT,
  })}`

/** The finished record's parameters: the id, fingerprint, status, response, request headers. */
const RECORD_TYPES = [...ID_TYPES, 'text', 'text', 'integer', 'jsonb', 'bytea', 'jsonb']
const INSERT_TYPES = [...RECORD_TYPES, 'float8', 'integer']
// The seen version ($10) is a timestamptz parameter rather than a text cast in the statement: Citus refuses a cast
// that is not IMMUTABLE (text to timestamptz depends on the time zone) in the DO UPDATE clause.
const FINISH_TYPES = [...RECORD_TYPES, 'timestamptz', 'text', 'float8', 'integer', 'uuid']

/**
 * The statements of the lock protocol for a table, built once per engine; `fenced: false` (only to prove, in the
 * chaos suite, that the fence is what prevents duplicates) finishes every key with an upsert that replaces any row.
 */
export function lockStatements(names: TableNames, fenced: boolean) {
  const texts = statementTexts({
    /**
     * The advisory lock, transaction-scoped, so it ends with the business transaction whatever happens to the
     * process. A collision of two in-flight keys only answers one of them 409. The same statement arms the lease
     * guard ({@link leaseGuard}, the lease in milliseconds as `$4`): the transaction, and so the lock, cannot outlive
     * a holder that stopped while alive by more than the lease. `locked` is true only when both ran (an AND is true
     * only once both sides were evaluated, in whichever order); a lock not granted needs no guard.
     *
     * The key's row is read by the next statement (`lockedLookup`), never by this one: a statement reads with the
     * snapshot taken when it started, before its lock was granted, so it can miss the record of a holder that
     * committed (and so let go of the lock) in between, and run the handler a second time. The next statement's
     * snapshot is taken after the lock was granted: it sees every commit of whoever held the lock before.
     */
    lock: {
      types: [...ID_TYPES, 'text'],
      text: `SELECT pg_try_advisory_xact_lock(${lockKey(names)}) AND ${leaseGuard('$4')} IS NOT NULL AS locked, ${SERVER}
${onKeysShard(names)}`,
    },
    lockedLookup: { types: ID_TYPES, text: packedLockedRow(names) },
    /**
     * Whether another attempt holds the key's lock (and since when), and the key's row, without taking the lock: a
     * probe that took it, even for one statement, could make a real attempt fail to get it and answer 409 for
     * nothing.
     */
    inspect: {
      types: ID_TYPES,
      text: `SELECT EXISTS (SELECT 1 FROM ${heldLock(names)}) AS held, ${holderMs(names)}, e.*, ${SERVER}
FROM (SELECT 1) AS one LEFT JOIN (${lockedRow(names)}) AS e ON true`,
    },
    /** How long the holder of a key's lock has held it, asked by a duplicate that did not get the lock. */
    holder: { types: ID_TYPES, text: `SELECT ${holderMs(names)} ${onKeysShard(names)}` },
    insertFinished: { types: INSERT_TYPES, text: insertFinishedText(names) },
    finish: { types: FINISH_TYPES, text: finishText(names, fenced) },
    saveRecoveryPoint: { types: SAVE_TYPES, text: saveRecoveryPointText(names) },
  })
  return {
    lock: (id: RecordId, leaseGuardMs: number) => bind(texts.lock, [...idValues(id), String(leaseGuardMs)]),
    lockedLookup: (id: RecordId) => bind(texts.lockedLookup, idValues(id)),
    inspect: (id: RecordId) => bind(texts.inspect, idValues(id)),
    holder: (id: RecordId) => bind(texts.holder, idValues(id)),
    /**
     * The finished record, sent last before the COMMIT: a plain INSERT when the attempt found no row and wrote none
     * (no recovery point), the fenced upsert otherwise (or always, unfenced).
     */
    finish: (id: RecordId, record: FinishRecord) =>
      fenced && record.seen === null && record.token === null
        ? bind(texts.insertFinished, [...recordValues(id, record), record.retentionMs, record.attempt])
        : bind(texts.finish, [
            ...recordValues(id, record),
            record.seen?.version ?? null,
            record.seen?.status ?? null,
            record.retentionMs,
            record.attempt,
            record.token ?? NO_TOKEN,
          ]),
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

/** The inspection's answer: whether the lock is held, and the row (all null when there is none). */
export type InspectedLock = { held: boolean; holder_ms: number | null; server: number } & (
  | LockedLookupRow
  | { [K in keyof LockedLookupRow]: null }
)

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
    ...idValues(id),
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
