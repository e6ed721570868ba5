// `reservation: 'row'`: the key row is committed as `in_progress` under a lease (one autocommit statement, sent in
// the same message as the business transaction's BEGIN), then completed in the business transaction, fenced on a
// random lock token. The row makes an attempt in flight visible (`in_progress`, with its lease as Retry-After) and
// lets a later attempt take over once the lease ran out; the fence keeps the earlier one from committing after.
import { randomUUID } from 'node:crypto'
import type pg from 'pg'
import type { StoredResponse } from '../engine/types.js'
import { endTransaction, prepare, preparesStatements, sendable } from './connection.js'
import type { ResolvedStore } from './postgres-store.js'
import * as q from './queries.js'
import {
  type Claim,
  type Inspection,
  type Reservation,
  type ReservationProtocol,
  type ReserveRequest,
  recordState,
} from './reservation.js'
import * as rq from './row-queries.js'
import { sideLane } from './side-lane.js'

export interface RowClaim extends Claim {
  /** The lock token the completion, the release and recovery points are fenced on. */
  readonly token: string
}

export function rowReservation(store: ResolvedStore, fenced: boolean): ReservationProtocol<RowClaim> {
  const { pool, names } = store
  const send = (query: q.Query) => sendable(query, store)
  // The lease guard is a fence too: the unfenced engine goes without it.
  const guarded = (request: ReserveRequest) => ({ ...request, leaseGuardMs: fenced ? request.leaseMs : 0 })

  /** Reserves on `client`. When it reserved, the business transaction has begun there (guarded by the lease). */
  async function reserveOn(
    client: pg.PoolClient,
    request: ReserveRequest,
    args: rq.ReserveArgs,
  ): Promise<rq.ReserveRow | undefined> {
    if (!preparesStatements(store)) {
      const row = (await client.query<rq.ReserveRow>(send(rq.reserve(names, request.id, args)))).rows[0]
      if (row?.reserved) await client.query(rq.beginGuarded(args.leaseGuardMs))
      return row
    }
    const { statement, text } = rq.reserveAndBegin(names, request.id, args)
    await prepare(client, statement)
    // One result per statement of the message: BEGIN, EXECUTE (the reservation), COMMIT, BEGIN, the guard.
    const results = (await client.query(text)) as unknown as pg.QueryResult<rq.ReserveRow>[]
    return results[1]?.rows[0]
  }

  /** What a row that is not ours tells the caller. */
  function answer(row: q.LookupRow | undefined, fingerprint: string): Inspection {
    const state = recordState(row, fingerprint)
    if (state === 'finished') return { kind: 'finished', row: row as q.LookupRow }
    if (state === 'busy')
      return {
        kind: 'busy',
        heldForMs: row?.held_ms ?? null,
        leaseRemainingMs: row?.lease_remaining_ms ?? null,
      }
    return { kind: state }
  }

  async function reserve(request: ReserveRequest): Promise<Reservation<RowClaim>> {
    const token = randomUUID()
    const client = await pool.connect()
    let row: q.LookupRow | undefined
    try {
      const reserved = await reserveOn(client, request, { ...guarded(request), token })
      if (reserved?.reserved) {
        const claim: RowClaim = {
          request,
          client,
          token,
          attempt: reserved.attempts ?? 1,
          recoveryPoint: reserved.recovery_point,
          // `status` and `expired` describe the row this reservation replaced, as the statement's snapshot saw it.
          replaced: reserved.expired ? 'expired' : reserved.status === 'in_progress' ? 'takeover' : null,
          expiresInMs: reserved.reserved_expires_in_ms ?? 0,
        }
        return { kind: 'claimed', claim }
      }
      // The snapshot can miss a row committed a moment ago that the INSERT then conflicted with: re-read it.
      row =
        reserved?.status === null
          ? (await client.query<q.LookupRow>(send(q.lookup(names, request.id)))).rows[0]
          : (reserved as q.LookupRow | undefined)
    } catch (error) {
      client.release(error as Error)
      throw error
    }
    // The reservation message began the business transaction; end it without making the answer wait.
    if (preparesStatements(store)) void endTransaction(client)
    else client.release()
    const found = answer(row, request.fingerprint)
    // Not reserved, yet free: the row changed between the statement's snapshot and its conflict check.
    return found.kind === 'free' ? { kind: 'raced' } : found
  }

  return {
    reserve,

    async inspect(request, on) {
      const row = (await on.query<q.LookupRow>(send(q.lookup(names, request.id)))).rows[0]
      return answer(row, request.fingerprint)
    },

    async complete(claim, status, response) {
      const { client, request } = claim
      const args = { token: claim.token, status, response }
      if (preparesStatements(store) && response.body.length <= q.INLINE_BODY_BYTES) {
        // One round trip: the completion fails on purpose when fenced out, which stops the message before COMMIT.
        const { statement, text } = rq.completeAndCommit(names, request.id, args, fenced)
        await prepare(client, statement)
        try {
          await client.query(text)
        } catch (error) {
          if (q.isFenceError(error)) return false
          throw error
        }
        return true
      }
      const completed = await client.query(send(rq.complete(names, request.id, args, fenced)))
      if (completed.rowCount !== 1) return false
      await client.query('COMMIT')
      return true
    },

    async fail(claim: RowClaim, response: StoredResponse) {
      const args = { token: claim.token, status: 'failed_permanent' as const, response }
      const failed = await claim.client.query(send(rq.complete(names, claim.request.id, args, fenced)))
      return failed.rowCount === 1
    },

    async release(claim, on) {
      await on.query(send(q.release(names, claim.request.id, claim.token)))
    },

    async saveRecoveryPoint(claim, point, tx) {
      const save = q.saveRecoveryPoint(names, claim.request.id, claim.token, point)
      return (await (tx ?? sideLane(pool)).query(save)).rowCount === 1
    },

    async renew(claim) {
      const { request, token } = claim
      const renewed = await sideLane(pool).query(send(q.renew(names, request.id, token, request.leaseMs)))
      return renewed.rowCount === 1
    },
  }
}
