// `reservation: 'lock'`: the key is reserved by a transaction-scoped advisory lock taken in the business
// transaction's first round trip, and the finished record is written by one fenced upsert sent with the COMMIT. One
// commit and three round trips per new key, like the bare transaction. The attempt holds the key exactly as long as
// its transaction lives: a crash frees it at once, and the lease guard makes Postgres end the transaction of a
// holder that stopped while alive. Nothing is written for the key until the commit, except by a recovery point.
import { randomUUID } from 'node:crypto'
import type { StoredResponse } from '../engine/types.js'
import { firstRow, type Session } from './database.js'
import { KeyRecords } from './key-records.js'
import * as lq from './lock-queries.js'
import type { ResolvedStore } from './postgres-store.js'
import * as q from './queries.js'
import {
  type Claim,
  type Exec,
  type Inspection,
  inspectionOf,
  type Reservation,
  type ReservationProtocol,
  type ReserveRequest,
  type ServerObserver,
} from './reservation.js'

export interface LockClaim<Tx = unknown> extends Claim<Tx> {
  /** The row version the attempt saw after taking the lock (null: there was no row); the finish is fenced on it. */
  readonly seen: { version: string; status: string } | null
  /** Created by the first recovery point: the row it writes carries it, and the finish accepts that row. */
  token: string | undefined
}

export function lockReservation<Tx>(
  store: ResolvedStore<Tx>,
  fenced: boolean,
  observe: ServerObserver = () => {},
): ReservationProtocol<LockClaim<Tx>> {
  return new LockReservation(store, fenced, observe)
}

/** What the lock and the lookup found: whether it got the lock, the key's row, the server. */
interface Found {
  locked: boolean
  row: lq.LockedLookupRow | undefined
  server: number
}

class LockReservation<Tx> implements ReservationProtocol<LockClaim<Tx>> {
  readonly #keys: KeyRecords<Tx>
  readonly #sql: lq.LockStatements
  /** Names the table's primary key, whose violation fences a finish out (see lq.isFinishConflict). */
  readonly #names: ResolvedStore<Tx>['names']
  /** Whether the lock must be taken on the key's shard (Citus is installed); asked on the first reservation. */
  #onShard: boolean | undefined

  constructor(store: ResolvedStore<Tx>, fenced: boolean, observe: ServerObserver) {
    this.#keys = new KeyRecords(store, fenced, observe)
    this.#sql = lq.lockStatements(store.names, fenced)
    this.#names = store.names
  }

  /**
   * BEGINs on the session, takes the key's advisory lock, arms the lease guard, then reads the row (in a statement of
   * its own, so its snapshot follows the lock: see lq.lock).
   */
  async #lockAndLookup(session: Session<Tx>, request: ReserveRequest): Promise<Found> {
    const onShard = this.#onShard ?? (await this.#askOnShard(session))
    const sentAt = performance.now()
    const results = await session.run([
      'BEGIN',
      this.#sql.lock(request.id, this.#keys.guardMs(request), onShard),
      this.#sql.lockedLookup(request.id),
    ])
    const lock = firstRow<lq.Locked>(results[1])
    const server = lock?.server ?? 0
    if (lock) this.#keys.observe(server, sentAt)
    const row = lq.lockedRowOf(firstRow<lq.RowJson>(results[2]), server)
    return { locked: lock?.locked === true, row, server }
  }

  /**
   * Whether the database has Citus, where a lock statement that names no table would run on the node the session
   * reached rather than on the one holding the key's shard (see lq.lockStatements). Asked once per engine, on the
   * first reservation's session, before its transaction.
   */
  async #askOnShard(session: Session<Tx>): Promise<boolean> {
    const [answer] = await session.run([CITUS_INSTALLED])
    this.#onShard = firstRow<{ citus: boolean }>(answer)?.citus === true
    return this.#onShard
  }

  /**
   * Writes the finished record and commits: true when it did, false when fenced out (the row changed, see
   * q.isFenceError, or another writer inserted it, see lq.isFinishConflict), when the transaction is still open.
   */
  async #finishOn(session: Session<Tx>, claim: LockClaim<Tx>, record: lq.FinishRecord): Promise<boolean> {
    try {
      await session.run([this.#sql.finish(claim.request.id, record), 'COMMIT'])
      return true
    } catch (error) {
      if (q.isFenceError(error) || lq.isFinishConflict(this.#names, error)) return false
      throw error
    }
  }

  /** How long the holder of the key's lock has held it, asked on the session of an attempt that did not get it. */
  async #holderMs(session: Session<Tx>, request: ReserveRequest): Promise<number | null> {
    const asked = await session.run([this.#sql.holder(request.id)])
    return firstRow<{ holder_ms: number | null }>(asked[0])?.holder_ms ?? null
  }

  async reserve(request: ReserveRequest): Promise<Reservation<LockClaim<Tx>>> {
    const { session, found, state } = await this.#keys.reserving(async (session) => {
      const found = await this.#lockAndLookup(session, request)
      const state =
        answer(found.locked, found.row, request.fingerprint) ??
        busySince(await this.#holderMs(session, request))
      return { session, found, state }
    })
    if (state.kind === 'free') return { kind: 'claimed', claim: claimOf(request, session, found) }
    // Not ours to run: end the transaction without making the answer wait.
    this.#keys.endAside(session)
    return state
  }

  async inspect(request: ReserveRequest, on: Exec): Promise<Inspection> {
    const sentAt = performance.now()
    const found = firstRow<lq.InspectedLock>(await on(this.#sql.inspect(request.id)))
    if (found) this.#keys.observe(found.server, sentAt)
    const row = lq.lockedRowOf(found, found?.server ?? 0)
    return answer(found?.held !== true, row, request.fingerprint) ?? busySince(found?.holder_ms ?? null)
  }

  complete(
    claim: LockClaim<Tx>,
    status: 'succeeded' | 'failed_permanent',
    response: StoredResponse,
  ): Promise<boolean> {
    return this.#finishOn(claim.session, claim, finishRecord(claim, status, response))
  }

  async fail(claim: LockClaim<Tx>, response: StoredResponse): Promise<boolean> {
    // The rollback ended the lock with the handler's writes: take it again, on the attempt's own session, to store
    // the failure, fenced on the row version the attempt first saw, so a record another attempt wrote meanwhile
    // stays. A fenced or refused finish leaves the transaction open: end it.
    const { session } = claim
    const { locked } = await this.#lockAndLookup(session, claim.request)
    const stored =
      locked && (await this.#finishOn(session, claim, finishRecord(claim, 'failed_permanent', response)))
    if (!stored) await session.run(['ROLLBACK'])
    return stored
  }

  async release(claim: LockClaim<Tx>, on: Exec): Promise<void> {
    // The rollback ended the lock. A row exists only if the attempt saved a recovery point: release it (fenced on
    // the token) so the next attempt need not wait out its lease.
    if (claim.token !== undefined) await this.#keys.release(claim.request, claim.token, on)
  }

  async renew(claim: LockClaim<Tx>): Promise<boolean> {
    // Until its first recovery point the attempt holds the key by its lock alone, which lives as long as its
    // transaction: nothing to renew.
    if (claim.token === undefined) return true
    return this.#keys.renew(claim.request, claim.token)
  }

  async saveRecoveryPoint(claim: LockClaim<Tx>, point: string, tx?: unknown): Promise<boolean> {
    claim.token ??= randomUUID()
    const save = this.#sql.saveRecoveryPoint(claim.request.id, {
      fingerprint: claim.request.fingerprint,
      point,
      token: claim.token,
      attempt: claim.attempt,
      leaseMs: claim.request.leaseMs,
      retentionMs: claim.request.retentionMs,
      requestHeaders: claim.request.requestHeaders,
      seen: claim.seen,
    })
    return this.#keys.save(save, tx)
  }
}

/** Whether the Citus extension is installed in the database (see LockReservation's #askOnShard). */
const CITUS_INSTALLED = {
  text: "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') AS citus",
  values: [],
}

/** The claim of an attempt that got the key's lock and found it free. */
function claimOf<Tx>(request: ReserveRequest, session: Session<Tx>, found: Found): LockClaim<Tx> {
  const { row } = found
  // A row that is not expired is an earlier attempt's: released after a retryable failure, or abandoned.
  const earlier = row && !row.expired ? row : undefined
  return {
    request,
    session,
    attempt: earlier ? earlier.attempts + 1 : 1,
    recoveryPoint: earlier?.recovery_point ?? null,
    replaced: row?.expired ? 'expired' : row?.status === 'in_progress' ? 'takeover' : null,
    // A record that was not expired keeps its expiry (measured by the lookup); a new one lives retentionMs
    // from the finish's now(), which is later than the reservation: both bounds are conservative.
    expiresInMs: earlier ? earlier.expires_in_ms : request.retentionMs,
    seen: row ? { version: row.version, status: row.status } : null,
    server: found.server,
    token: undefined,
  }
}

function finishRecord<Tx>(
  claim: LockClaim<Tx>,
  status: 'succeeded' | 'failed_permanent',
  response: lq.FinishRecord['response'],
): lq.FinishRecord {
  return {
    fingerprint: claim.request.fingerprint,
    status,
    response,
    requestHeaders: claim.request.requestHeaders,
    retentionMs: claim.request.retentionMs,
    seen: claim.seen,
    attempt: claim.attempt,
    token: claim.token ?? null,
  }
}

/**
 * What the row says, for an attempt that may not take the key. A row in progress under a live lease was written by
 * the holder's recovery point: it says how long the holder has run since, and its lease. A lock held without such
 * a row says nothing but the holder's start: `null`, for the caller to ask pg_stat_activity (see {@link busySince}).
 */
function answer(
  locked: boolean,
  row: lq.LockedLookupRow | undefined,
  fingerprint: string,
): Inspection | null {
  const found = inspectionOf(row, fingerprint)
  return found.kind !== 'free' || locked ? found : null
}

/** A key whose lock is held by an attempt that has run for `heldForMs` (null: unknown). */
const busySince = (heldForMs: number | null): Inspection => ({
  kind: 'busy',
  heldForMs,
  leaseRemainingMs: null,
})
