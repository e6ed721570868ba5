// `reservation: 'lock'`: the key is reserved by a transaction-scoped advisory lock taken in the business
// transaction's first round trip, and the finished record is written by one fenced upsert sent with the COMMIT. One
// commit and three round trips per new key, like the bare transaction. The attempt holds the key exactly as long as
// its transaction lives: a crash frees it at once, and the lease guard makes Postgres end the transaction of a
// holder that stopped while alive. Nothing is written for the key until the commit, except by a recovery point.
import { randomUUID } from 'node:crypto'
import type pg from 'pg'
import { endTransaction, prepare, preparesStatements, sendable } from './connection.js'
import * as lq from './lock-queries.js'
import type { ResolvedStore } from './postgres-store.js'
import * as q from './queries.js'
import {
  type Claim,
  type Inspection,
  type ReservationProtocol,
  type ReserveRequest,
  recordState,
} from './reservation.js'

export interface LockClaim extends Claim {
  /** The row version the attempt saw after taking the lock (null: there was no row); the finish is fenced on it. */
  readonly seen: { version: string; status: string } | null
  /** Created by the first recovery point: the row it writes carries it, and the finish accepts that row. */
  token: string | undefined
}

/** Retry-After for a duplicate that found the lock held: the holder's progress is not recorded anywhere. */
const LOCK_HELD_RETRY_AFTER_MS = 1_000

/** A uuid no row carries: the finish's token when the attempt saved no recovery point. */
const NO_TOKEN = '00000000-0000-0000-0000-000000000000'

export function lockReservation(store: ResolvedStore, fenced: boolean): ReservationProtocol<LockClaim> {
  const { pool, names } = store
  const send = (query: q.Query) => sendable(query, store)
  // The lease guard is a fence too: the unfenced engine goes without it.
  const guardMs = (request: ReserveRequest) => (fenced ? request.leaseMs : 0)

  /** BEGINs on `client`, takes the key's advisory lock, arms the lease guard and reads the row. */
  async function lockAndLookup(
    client: pg.PoolClient,
    request: ReserveRequest,
  ): Promise<{ locked: boolean; row: lq.LockedLookupRow | undefined }> {
    let answer: lq.LockedLookup | undefined
    if (!preparesStatements(store)) {
      await client.query('BEGIN')
      answer = (
        await client.query<lq.LockedLookup>(lq.lockAndLookupQuery(names, request.id, guardMs(request)))
      ).rows[0]
    } else {
      const { statement, text } = lq.beginLockAndLookup(names, request.id, guardMs(request))
      await prepare(client, statement)
      const results = (await client.query(text)) as unknown as pg.QueryResult<lq.LockedLookup>[]
      answer = results[1]?.rows[0]
    }
    return {
      locked: answer?.locked === true,
      row: answer?.status == null ? undefined : (answer as lq.LockedLookupRow),
    }
  }

  /** Writes the finished record and commits; throws a fence error (see q.isFenceError) when the row changed. */
  async function finishOn(client: pg.PoolClient, claim: LockClaim, record: lq.FinishRecord): Promise<void> {
    const { id } = claim.request
    if (preparesStatements(store) && record.response.body.length <= q.INLINE_BODY_BYTES) {
      const { statement, text } = lq.finishAndCommit(names, id, record, fenced)
      await prepare(client, statement)
      await client.query(text)
      return
    }
    await client.query(send(lq.finishQuery(names, id, record, fenced)))
    await client.query('COMMIT')
  }

  const finishRecord = (
    claim: LockClaim,
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
    token: claim.token ?? NO_TOKEN,
  })

  /** What the row says, for an attempt that may not take the key. */
  function answer(locked: boolean, row: lq.LockedLookupRow | undefined, fingerprint: string): Inspection {
    const state = recordState(row, fingerprint)
    if (state === 'finished') return { kind: 'finished', row: row as lq.LockedLookupRow }
    if (state === 'mismatch') return { kind: 'mismatch' }
    if (state === 'busy')
      return { kind: 'busy', retryAfterMs: row?.lease_remaining_ms ?? LOCK_HELD_RETRY_AFTER_MS }
    return locked ? { kind: 'free' } : { kind: 'busy', retryAfterMs: LOCK_HELD_RETRY_AFTER_MS }
  }

  return {
    async reserve(request) {
      const client = await pool.connect()
      let found: { locked: boolean; row: lq.LockedLookupRow | undefined }
      try {
        found = await lockAndLookup(client, request)
      } catch (error) {
        client.release(error as Error)
        throw error
      }
      const { locked, row } = found
      const state = answer(locked, row, request.fingerprint)
      if (state.kind === 'free') {
        // A row that is not expired is an earlier attempt's: released after a retryable failure, or abandoned.
        const earlier = row && !row.expired ? row : undefined
        const claim: LockClaim = {
          request,
          client,
          attempt: earlier ? earlier.attempts + 1 : 1,
          recoveryPoint: earlier?.recovery_point ?? null,
          replaced: row?.expired ? 'expired' : row?.status === 'in_progress' ? 'takeover' : null,
          // A record that was not expired keeps its expiry (measured by the lookup); a new one lives retentionMs
          // from the finish's now(), which is later than the reservation: both bounds are conservative.
          expiresInMs: earlier ? earlier.expires_in_ms : request.retentionMs,
          seen: row ? { version: row.version, status: row.status } : null,
          token: undefined,
        }
        return { kind: 'claimed', claim }
      }
      // Not ours to run: end the transaction without making the answer wait.
      void endTransaction(client)
      return state
    },

    async inspect(request) {
      const found = (await pool.query<lq.InspectedLock>(send(lq.inspectQuery(names, request.id)))).rows[0]
      const row = found?.status == null ? undefined : (found as lq.LockedLookupRow)
      return answer(found?.held !== true, row, request.fingerprint)
    },

    async complete(claim, status, response) {
      try {
        await finishOn(claim.client, claim, finishRecord(claim, status, response))
        return true
      } catch (error) {
        if (q.isFenceError(error)) return false
        throw error
      }
    },

    async fail(claim, response) {
      // The rollback ended the lock with the handler's writes: take it again to store the failure, fenced on the
      // row version the attempt first saw, so a record another attempt wrote meanwhile stays.
      const client = await pool.connect()
      let locked: boolean
      try {
        ;({ locked } = await lockAndLookup(client, claim.request))
        if (locked) await finishOn(client, claim, finishRecord(claim, 'failed_permanent', response))
      } catch (error) {
        if (!q.isFenceError(error)) {
          client.release(error as Error)
          throw error
        }
        locked = false
      }
      if (locked) client.release()
      else await endTransaction(client)
      return locked
    },

    async release(claim) {
      // The rollback ended the lock. A row exists only if the attempt saved a recovery point: release it (fenced on
      // the token) so the next attempt need not wait out its lease.
      if (claim.token !== undefined) await pool.query(send(q.release(names, claim.request.id, claim.token)))
    },

    async saveRecoveryPoint(claim, point, tx) {
      claim.token ??= randomUUID()
      const save = lq.saveRecoveryPoint(names, claim.request.id, {
        fingerprint: claim.request.fingerprint,
        point,
        token: claim.token,
        attempt: claim.attempt,
        leaseMs: claim.request.leaseMs,
        retentionMs: claim.request.retentionMs,
        requestHeaders: claim.request.requestHeaders,
        seen: claim.seen,
      })
      return (await (tx ?? pool).query(save)).rowCount === 1
    },
  }
}
