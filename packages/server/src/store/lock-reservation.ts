// `reservation: 'lock'`: the key is reserved by a transaction-scoped advisory lock taken in the business
// transaction's first round trip, and the finished record is written by one fenced upsert sent with the COMMIT. One
// commit and three round trips per new key, like the bare transaction. The attempt holds the key exactly as long as
// its transaction lives: a crash frees it at once, and the lease guard makes Postgres end the transaction of a
// holder that stopped while alive. Nothing is written for the key until the commit, except by a recovery point.
import { randomUUID } from 'node:crypto'
import { firstRow, type Session } from './database.js'
import * as lq from './lock-queries.js'
import type { ResolvedStore } from './postgres-store.js'
import * as q from './queries.js'
import {
  type Claim,
  type Inspection,
  type ReservationProtocol,
  type ReserveRequest,
  recordState,
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
  const { database, names } = store
  const sql = lq.lockStatements(names, fenced)
  const keySql = q.keyStatements(names)
  // The lease guard is a fence too: the unfenced engine goes without it, and so does one connection, where no other
  // attempt can take the key over while the transaction is open.
  const guardMs = (request: ReserveRequest) => (fenced && !database.oneConnection ? request.leaseMs : 0)

  /**
   * BEGINs on the session, takes the key's advisory lock, arms the lease guard, then reads the row (in a statement of
   * its own, so its snapshot follows the lock: see lq.lock).
   */
  async function lockAndLookup(
    session: Session<Tx>,
    request: ReserveRequest,
  ): Promise<{ locked: boolean; row: lq.LockedLookupRow | undefined; server: number }> {
    const sentAt = performance.now()
    const results = await session.run([
      'BEGIN',
      sql.lock(request.id, guardMs(request)),
      sql.lockedLookup(request.id),
    ])
    const row = firstRow<lq.LockedLookupRow>(results[2])
    const lock = firstRow<lq.Locked>(results[1])
    const server = lock?.server ?? 0
    if (lock) observe(server, sentAt)
    if (row) row.server = server
    return { locked: lock?.locked === true, row, server }
  }

  /**
   * Writes the finished record and commits: true when it did, false when fenced out (the row changed, see
   * q.isFenceError, or another writer inserted it, see lq.isFinishConflict), when the transaction is still open.
   */
  async function finishOn(
    session: Session<Tx>,
    claim: LockClaim<Tx>,
    record: lq.FinishRecord,
  ): Promise<boolean> {
    try {
      await session.run([sql.finish(claim.request.id, record), 'COMMIT'])
      return true
    } catch (error) {
      if (q.isFenceError(error) || lq.isFinishConflict(names, error)) return false
      throw error
    }
  }

  const finishRecord = (
    claim: LockClaim<Tx>,
    status: 'succeeded' | 'failed_permanent',
    response: lq.FinishRecord['response'],
  ): lq.FinishRecord => ({
    fingerprint: claim.request.fingerprint,
    status,
    response,
    requestHeaders: claim.request.requestHeaders,
    retentionMs: claim.request.retentionMs,
    seen: claim.seen,
    attempt: claim.attempt,
    token: claim.token ?? null,
  })

  /**
   * What the row says, for an attempt that may not take the key. A row in progress under a live lease was written by
   * the holder's recovery point: it says how long the holder has run since, and its lease. A lock held without such
   * a row says nothing but the holder's start, asked of pg_stat_activity (`holderMs`, when it was asked).
   */
  function answer(
    locked: boolean,
    row: lq.LockedLookupRow | undefined,
    fingerprint: string,
    holderMs: () => Promise<number | null>,
  ): Inspection | Promise<Inspection> {
    const state = recordState(row, fingerprint)
    if (state === 'finished') return { kind: 'finished', row: row as lq.LockedLookupRow }
    if (state === 'mismatch') return { kind: 'mismatch' }
    if (state === 'busy')
      return {
        kind: 'busy',
        heldForMs: row?.held_ms ?? null,
        leaseRemainingMs: row?.lease_remaining_ms ?? null,
      }
    if (locked) return { kind: 'free' }
    return holderMs().then((heldForMs) => ({ kind: 'busy', heldForMs, leaseRemainingMs: null }))
  }

  return {
    async reserve(request) {
      const session = await database.session()
      let found: Awaited<ReturnType<typeof lockAndLookup>>
      let state: Inspection
      try {
        found = await lockAndLookup(session, request)
        state = await answer(found.locked, found.row, request.fingerprint, async () => {
          const asked = await session.run([sql.holder(request.id)])
          return firstRow<{ holder_ms: number | null }>(asked[0])?.holder_ms ?? null
        })
      } catch (error) {
        session.release(error as Error)
        throw error
      }
      const { row } = found
      if (state.kind === 'free') {
        // A row that is not expired is an earlier attempt's: released after a retryable failure, or abandoned.
        const earlier = row && !row.expired ? row : undefined
        const claim: LockClaim<Tx> = {
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
        return { kind: 'claimed', claim }
      }
      // Not ours to run: end the transaction without making the answer wait.
      void session.run(['ROLLBACK']).then(
        () => session.release(),
        (error) => session.release(error as Error),
      )
      return state
    },

    async inspect(request, on) {
      const sentAt = performance.now()
      const found = firstRow<lq.InspectedLock>(await on(sql.inspect(request.id)))
      if (found) observe(found.server as number, sentAt)
      const row = found?.status == null ? undefined : (found as lq.LockedLookupRow)
      return answer(found?.held !== true, row, request.fingerprint, async () => found?.holder_ms ?? null)
    },

    async complete(claim, status, response) {
      return finishOn(claim.session, claim, finishRecord(claim, status, response))
    },

    async fail(claim, response) {
      // The rollback ended the lock with the handler's writes: take it again, on the attempt's own session, to store
      // the failure, fenced on the row version the attempt first saw, so a record another attempt wrote meanwhile
      // stays. A fenced or refused finish leaves the transaction open: end it.
      const { session } = claim
      const { locked } = await lockAndLookup(session, claim.request)
      const stored =
        locked && (await finishOn(session, claim, finishRecord(claim, 'failed_permanent', response)))
      if (!stored) await session.run(['ROLLBACK'])
      return stored
    },

    async release(claim, on) {
      // The rollback ended the lock. A row exists only if the attempt saved a recovery point: release it (fenced on
      // the token) so the next attempt need not wait out its lease.
      if (claim.token !== undefined) await on(keySql.release(claim.request.id, claim.token))
    },

    async renew(claim) {
      // Until its first recovery point the attempt holds the key by its lock alone, which lives as long as its
      // transaction: nothing to renew.
      if (claim.token === undefined) return true
      const { request } = claim
      return (await database.side(keySql.renew(request.id, claim.token, request.leaseMs))).rowCount === 1
    },

    async saveRecoveryPoint(claim, point, tx) {
      claim.token ??= randomUUID()
      const save = sql.saveRecoveryPoint(claim.request.id, {
        fingerprint: claim.request.fingerprint,
        point,
        token: claim.token,
        attempt: claim.attempt,
        leaseMs: claim.request.leaseMs,
        retentionMs: claim.request.retentionMs,
        requestHeaders: claim.request.requestHeaders,
        seen: claim.seen,
      })
      const saved = tx === undefined ? await database.side(save) : await database.execute(tx as Tx, save)
      return saved.rowCount === 1
    },
  }
}
