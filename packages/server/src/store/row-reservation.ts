// `reservation: 'row'`: the key row is committed as `in_progress` under a lease (a transaction of its own, sent
// ahead of the business transaction's BEGIN), then completed in the business transaction, fenced on a random lock
// token. The row makes an attempt in flight visible (`in_progress`, with its lease) and lets a later attempt take
// over once the lease ran out; the fence keeps the earlier one from committing after.
import { randomUUID } from 'node:crypto'
import type { StoredResponse } from '../engine/types.js'
import { firstRow } from './database.js'
import type { ResolvedStore } from './postgres-store.js'
import * as q from './queries.js'
import {
  type Claim,
  type Inspection,
  type Reservation,
  type ReservationProtocol,
  recordState,
  type ServerObserver,
} from './reservation.js'
import * as rq from './row-queries.js'

export interface RowClaim<Tx = unknown> extends Claim<Tx> {
  /** The lock token the completion, the release and recovery points are fenced on. */
  readonly token: string
}

export function rowReservation<Tx>(
  store: ResolvedStore<Tx>,
  fenced: boolean,
  observe: ServerObserver = () => {},
): ReservationProtocol<RowClaim<Tx>> {
  const { database, names } = store
  const sql = rq.rowStatements(names, fenced)
  const keySql = q.keyStatements(names)

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

  /** The completion; false when fenced out (the statement fails on purpose, see rq.complete). */
  async function completed(run: Promise<unknown>): Promise<boolean> {
    try {
      await run
      return true
    } catch (error) {
      if (q.isFenceError(error)) return false
      throw error
    }
  }

  async function reserve(
    request: Parameters<ReservationProtocol['reserve']>[0],
  ): Promise<Reservation<RowClaim<Tx>>> {
    const token = randomUUID()
    const sentAt = performance.now()
    const session = await database.session()
    let row: q.LookupRow | undefined
    try {
      // No lease guard on one connection: no other attempt can take the key over while the transaction is open.
      const guarded = fenced && !database.oneConnection
      const args = { ...request, token, leaseGuardMs: guarded ? request.leaseMs : 0 }
      // The reservation commits in a transaction of its own (with synchronous_commit off, see rq.reserve); the
      // business transaction begins after it, in the same message, guarded by the lease. Past a failed reservation
      // nothing of it runs.
      const results = await session.run([
        'BEGIN',
        sql.reserve(request.id, args),
        'COMMIT',
        'BEGIN',
        rq.guard(args.leaseGuardMs),
      ])
      const reserved = firstRow<rq.ReserveRow>(results[1])
      if (reserved) observe(reserved.server as number, sentAt)
      if (reserved?.reserved) {
        const claim: RowClaim<Tx> = {
          request,
          session,
          token,
          attempt: reserved.attempts ?? 1,
          recoveryPoint: reserved.recovery_point,
          // `status` and `expired` describe the row this reservation replaced, as the statement's snapshot saw it.
          replaced: reserved.expired ? 'expired' : reserved.status === 'in_progress' ? 'takeover' : null,
          expiresInMs: reserved.reserved_expires_in_ms ?? 0,
          server: reserved.server as number,
        }
        return { kind: 'claimed', claim }
      }
      // The snapshot can miss a row committed a moment ago that the INSERT then conflicted with: re-read it.
      row =
        reserved?.status === null
          ? firstRow<q.LookupRow>((await session.run([keySql.lookup(request.id)]))[0])
          : (reserved as q.LookupRow | undefined)
    } catch (error) {
      session.release(error as Error)
      throw error
    }
    // The message began the business transaction: end it without making the answer wait.
    void session.run(['ROLLBACK']).then(
      () => session.release(),
      (error) => session.release(error as Error),
    )
    const found = answer(row, request.fingerprint)
    // Not reserved, yet free: the row changed between the statement's snapshot and its conflict check.
    return found.kind === 'free' ? { kind: 'raced' } : found
  }

  return {
    reserve,

    async inspect(request, on) {
      const sentAt = performance.now()
      const row = firstRow<q.LookupRow>(await on(keySql.lookup(request.id)))
      if (row) observe(row.server, sentAt)
      return answer(row, request.fingerprint)
    },

    async complete(claim, status, response) {
      const finish = sql.complete(claim.request.id, { token: claim.token, status, response })
      return completed(claim.session.run([finish, 'COMMIT']))
    },

    async fail(claim, response: StoredResponse) {
      const args = { token: claim.token, status: 'failed_permanent' as const, response }
      return completed(claim.session.run([sql.complete(claim.request.id, args)]))
    },

    async release(claim, on) {
      await on(keySql.release(claim.request.id, claim.token))
    },

    async saveRecoveryPoint(claim, point, tx) {
      const save = keySql.saveRecoveryPoint(claim.request.id, claim.token, point)
      const saved = tx === undefined ? await database.side(save) : await database.execute(tx as Tx, save)
      return saved.rowCount === 1
    },

    async renew(claim) {
      const { request, token } = claim
      return (await database.side(keySql.renew(request.id, token, request.leaseMs))).rowCount === 1
    },
  }
}
