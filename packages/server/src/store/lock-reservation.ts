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
import { sideLane } from './side-lane.js'

export interface LockClaim extends Claim {
  /** The row version the attempt saw after taking the lock (null: there was no row); the finish is fenced on it. */
  readonly seen: { version: string; status: string } | null
  /** Created by the first recovery point: the row it writes carries it, and the finish accepts that row. */
  token: string | undefined
}

/** A uuid no row carries: the finish's token when the attempt saved no recovery point. */
const NO_TOKEN = '00000000-0000-0000-0000-000000000000'

export function lockReservation(store: ResolvedStore, fenced: boolean): ReservationProtocol<LockClaim> {
  const { pool, names } = store
  const send = (query: q.Query) => sendable(query, store)
  // The lease guard is a fence too: the unfenced engine goes without it.
  const guardMs = (request: ReserveRequest) => (fenced ? request.leaseMs : 0)

  /**
   * BEGINs on `client`, takes the key's advisory lock, arms the lease guard, then reads the row (in a statement of
   * its own, so its snapshot follows the lock: see lockText in lock-queries.ts).
   */
  async function lockAndLookup(
    client: pg.PoolClient,
    request: ReserveRequest,
  ): Promise<{ locked: boolean; row: lq.LockedLookupRow | undefined }> {
    let locked: boolean
    let row: lq.LockedLookupRow | undefined
    if (!preparesStatements(store)) {
      const results = (await client.query(
        lq.beginLock(names, request.id, guardMs(request)),
      )) as unknown as pg.QueryResult[]
      locked = (results[1]?.rows[0] as lq.Locked | undefined)?.locked === true
      row = (await client.query<lq.LockedLookupRow>(lq.lockedLookupQuery(names, request.id))).rows[0]
    } else {
      const { statements, text } = lq.beginLockAndLookup(names, request.id, guardMs(request))
      for (const statement of statements) await prepare(client, statement)
      // One result per statement of the message: BEGIN, the lock, the lookup.
      const results = (await client.query(text)) as unknown as pg.QueryResult[]
      locked = (results[1]?.rows[0] as lq.Locked | undefined)?.locked === true
      row = results[2]?.rows[0] as lq.LockedLookupRow | undefined
    }
    return { locked, row }
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
      const client = await pool.connect()
      let found: { locked: boolean; row: lq.LockedLookupRow | undefined }
      try {
        found = await lockAndLookup(client, request)
      } catch (error) {
        client.release(error as Error)
        throw error
      }
      const { locked, row } = found
      let state: Inspection
      try {
        state = await answer(locked, row, request.fingerprint, async () => {
          const asked = await client.query<{ holder_ms: number | null }>(
            send(lq.holderQuery(names, request.id)),
          )
          return asked.rows[0]?.holder_ms ?? null
        })
      } catch (error) {
        client.release(error as Error)
        throw error
      }
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

    async inspect(request, on) {
      const found = (await on.query<lq.InspectedLock>(send(lq.inspectQuery(names, request.id)))).rows[0]
      const row = found?.status == null ? undefined : (found as lq.LockedLookupRow)
      return answer(found?.held !== true, row, request.fingerprint, async () => found?.holder_ms ?? null)
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
      // The rollback ended the lock with the handler's writes: take it again, on the attempt's own client, to store
      // the failure, fenced on the row version the attempt first saw, so a record another attempt wrote meanwhile
      // stays. A fenced or refused finish leaves the transaction open: end it.
      const { client } = claim
      let stored = false
      try {
        const { locked } = await lockAndLookup(client, claim.request)
        if (locked) {
          await finishOn(client, claim, finishRecord(claim, 'failed_permanent', response))
          stored = true
        }
      } catch (error) {
        if (!q.isFenceError(error)) throw error
      }
      if (!stored) await client.query('ROLLBACK')
      return stored
    },

    async release(claim, on) {
      // The rollback ended the lock. A row exists only if the attempt saved a recovery point: release it (fenced on
      // the token) so the next attempt need not wait out its lease.
      if (claim.token !== undefined) await on.query(send(q.release(names, claim.request.id, claim.token)))
    },

    async renew(claim) {
      // Until its first recovery point the attempt holds the key by its lock alone, which lives as long as its
      // transaction: nothing to renew.
      if (claim.token === undefined) return true
      const { request } = claim
      const renewed = await sideLane(pool).query(
        send(q.renew(names, request.id, claim.token, request.leaseMs)),
      )
      return renewed.rowCount === 1
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
      return (await (tx ?? sideLane(pool)).query(save)).rowCount === 1
    },
  }
}
