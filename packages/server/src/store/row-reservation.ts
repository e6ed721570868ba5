// `reservation: 'row'`: the key row is committed as `in_progress` under a lease (a transaction of its own, sent
// ahead of the business transaction's BEGIN), then completed in the business transaction, fenced on a random lock
// token. The row makes an attempt in flight visible (`in_progress`, with its lease) and lets a later attempt take
// over once the lease ran out; the fence keeps the earlier one from committing after.
import { randomUUID } from 'node:crypto'
import type { StoredResponse } from '../engine/types.js'
import { firstRow, type Session } from './database.js'
import { KeyRecords } from './key-records.js'
import type { ResolvedStore } from './postgres-store.js'
import * as q from './queries.js'
import * as r from './reservation.js'
import * as rq from './row-queries.js'

export interface RowClaim<Tx = unknown> extends r.Claim<Tx> {
  /** The lock token the completion, the release and recovery points are fenced on. */
  readonly token: string
}

export function rowReservation<Tx>(
  store: ResolvedStore<Tx>,
  fenced: boolean,
  observe: r.ServerObserver = () => {},
): r.ReservationProtocol<RowClaim<Tx>> {
  return new RowReservation(store, fenced, observe)
}

class RowReservation<Tx> implements r.ReservationProtocol<RowClaim<Tx>> {
  readonly #keys: KeyRecords<Tx>
  readonly #sql: rq.RowStatements

  constructor(store: ResolvedStore<Tx>, fenced: boolean, observe: r.ServerObserver) {
    this.#keys = new KeyRecords(store, fenced, observe)
    this.#sql = rq.rowStatements(store.names, fenced)
  }

  async reserve(request: r.ReserveRequest): Promise<r.Reservation<RowClaim<Tx>>> {
    const token = randomUUID()
    const sentAt = performance.now()
    const sent = await this.#keys.reserving((session) => this.#reserveOn(session, request, token, sentAt))
    if ('claim' in sent) return { kind: 'claimed', claim: sent.claim }
    // The message began the business transaction: end it without making the answer wait.
    this.#keys.endAside(sent.session)
    const found = r.inspectionOf(sent.row, request.fingerprint)
    // Not reserved, yet free: the row changed between the statement's snapshot and its conflict check.
    return found.kind === 'free' ? { kind: 'raced' } : found
  }

  /** Sends the reservation on `session`: the claim, or the key's row when it was not reserved (and the session). */
  async #reserveOn(
    session: Session<Tx>,
    request: r.ReserveRequest,
    token: string,
    sentAt: number,
  ): Promise<{ claim: RowClaim<Tx> } | { row: q.LookupRow | undefined; session: Session<Tx> }> {
    const args = { ...request, token, leaseGuardMs: this.#keys.guardMs(request) }
    // The reservation commits in a transaction of its own (with synchronous_commit off, see rq.reserve); the
    // business transaction begins after it, in the same message, guarded by the lease. Past a failed reservation
    // nothing of it runs.
    const results = await session.run([
      'BEGIN',
      this.#sql.reserve(request.id, args),
      'COMMIT',
      'BEGIN',
      rq.guard(args.leaseGuardMs),
    ])
    const reserved = firstRow<rq.ReserveRow>(results[1])
    if (reserved) this.#keys.observe(reserved.server as number, sentAt)
    if (reserved?.reserved) return { claim: claimOf(request, session, token, reserved) }
    // The snapshot can miss a row committed a moment ago that the INSERT then conflicted with: re-read it.
    const row =
      reserved?.status === null
        ? firstRow<q.LookupRow>((await session.run([this.#keys.sql.lookup(request.id)]))[0])
        : (reserved as q.LookupRow | undefined)
    return { row, session }
  }

  async inspect(request: r.ReserveRequest, on: r.Exec): Promise<r.Inspection> {
    const sentAt = performance.now()
    const row = firstRow<q.LookupRow>(await on(this.#keys.sql.lookup(request.id)))
    if (row) this.#keys.observe(row.server, sentAt)
    return r.inspectionOf(row, request.fingerprint)
  }

  async complete(
    claim: RowClaim<Tx>,
    status: 'succeeded' | 'failed_permanent',
    response: StoredResponse,
  ): Promise<boolean> {
    const finish = this.#sql.complete(claim.request.id, { token: claim.token, status, response })
    return completed(claim.session.run([finish, 'COMMIT']))
  }

  async fail(claim: RowClaim<Tx>, response: StoredResponse): Promise<boolean> {
    const args = { token: claim.token, status: 'failed_permanent' as const, response }
    return completed(claim.session.run([this.#sql.complete(claim.request.id, args)]))
  }

  async release(claim: RowClaim<Tx>, on: r.Exec): Promise<void> {
    await this.#keys.release(claim.request, claim.token, on)
  }

  async saveRecoveryPoint(claim: RowClaim<Tx>, point: string, tx?: unknown): Promise<boolean> {
    return this.#keys.save(this.#keys.sql.saveRecoveryPoint(claim.request.id, claim.token, point), tx)
  }

  async renew(claim: RowClaim<Tx>): Promise<boolean> {
    return this.#keys.renew(claim.request, claim.token)
  }
}

/** The claim of a reservation that reserved the key. */
function claimOf<Tx>(
  request: r.ReserveRequest,
  session: Session<Tx>,
  token: string,
  reserved: rq.ReserveRow,
): RowClaim<Tx> {
  return {
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
