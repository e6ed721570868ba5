// The one seam between the engine's attempt runner and the two ways a key can be reserved in Postgres ('row' and
// 'lock'). The runner owns everything an attempt does around the handler (the transaction's life, rollback,
// classification, size checks, events, the replay cache, the bounded wait); a protocol owns only the SQL of
// claiming, finishing, failing and releasing a key.
import type { StoredResponse } from '../engine/types.js'
import type { Rows, Session, Statement } from './database.js'
import type { LookupRow, RecordId } from './queries.js'

/**
 * Told the identity of the server each reservation or inspection reached (see SERVER in queries.ts), with the local
 * instant its statement was sent: the replay cache's confirmation.
 */
export type ServerObserver = (server: number, sentAt: number) => void

/** What one attempt asks to reserve. */
export interface ReserveRequest {
  id: RecordId
  fingerprint: string
  leaseMs: number
  retentionMs: number
  requestHeaders: Record<string, string> | null
}

/** A key this attempt holds. Its business transaction is open on `session` (with the lease guard armed). */
export interface Claim<Tx = unknown> {
  readonly request: ReserveRequest
  readonly session: Session<Tx>
  /** 1 for the first execution of the key, then 2, 3... (see `ExecutionContext.attempt`). */
  readonly attempt: number
  /** The recovery point an earlier attempt saved, or null. */
  readonly recoveryPoint: string | null
  /** What the claim replaced: an expired record, or an attempt that stopped holding the key (a takeover). */
  readonly replaced: 'expired' | 'takeover' | null
  /** Milliseconds from before the reservation was sent until the finished record will expire (replay cache). */
  readonly expiresInMs: number
  /** The server the reservation reached (see SERVER in queries.ts): the one that will hold the finished record. */
  readonly server: number
}

/** What a key's record says when this attempt does not (or may not) hold it. */
export type Inspection =
  /** A finished record, with whatever fingerprint it has (the runner tells a replay from a mismatch). */
  | { kind: 'finished'; row: LookupRow }
  /** A live record of another request under the same key, not finished yet. */
  | { kind: 'mismatch' }
  /**
   * Another attempt holds the key: for how long it has run (since it reserved the key or saved its last recovery
   * point), and how much of its lease is left, each when the store knows it.
   */
  | { kind: 'busy'; heldForMs: number | null; leaseRemainingMs: number | null }
  /** Nobody holds the key: a reservation would claim it. */
  | { kind: 'free' }

/** The answer to a reservation: the key is ours, or what the record says instead. */
export type Reservation<C extends Claim = Claim> =
  | { kind: 'claimed'; claim: C }
  | Exclude<Inspection, { kind: 'free' }>
  /** The key changed under the reservation (released, reaped, taken over meanwhile): ask again. */
  | { kind: 'raced' }

/**
 * Where a statement that follows an attempt's business transaction runs: the attempt's own session, idle again once
 * the transaction ended, or (once the attempt gave a broken connection back) the pool. Never a second connection
 * while the attempt holds one: with every connection held by attempts waiting for another, nothing would answer.
 */
export type Exec = (statement: Statement) => Promise<Rows>

/**
 * One reservation protocol. Every method that is handed a claim acts only while the claim still holds the key
 * (fenced): a claim that lost its key meanwhile gets `false` and changes nothing.
 */
export interface ReservationProtocol<C extends Claim = Claim<unknown>> {
  /**
   * Connects and reserves. When claimed, the business transaction is open on the claim's client, which the caller
   * then owns. Otherwise the client is already back in the pool. Rejects when the store fails.
   */
  reserve(request: ReserveRequest): Promise<Reservation<C>>
  /** What a reservation would find, without claiming or writing anything, on `on`. Rejects when the store fails. */
  inspect(request: ReserveRequest, on: Exec): Promise<Inspection>
  /** Writes the finished record and commits, in the business transaction. False when fenced out (still open). */
  complete(claim: C, status: 'succeeded' | 'failed_permanent', response: StoredResponse): Promise<boolean>
  /**
   * Stores a permanent failure after the business transaction was rolled back, on the claim's session (idle again).
   * False when fenced out. The client is outside any transaction when it settles, whatever the answer.
   */
  fail(claim: C, response: StoredResponse): Promise<boolean>
  /** Frees the key after the business transaction was rolled back, on `on`, so the next attempt runs at once. */
  release(claim: C, on: Exec): Promise<void>
  /**
   * Saves a recovery point, committed at once on the side lane, or on `tx` (a transaction of the caller's, in the
   * library's own type), to commit with it. False when fenced out.
   */
  saveRecoveryPoint(claim: C, point: string, tx?: unknown): Promise<boolean>
  /**
   * Extends the lease a live attempt holds in the key's row, committed at once on the side lane; resolves `false`
   * when the key is no longer the attempt's, `true` otherwise (also when the protocol keeps no lease in a row).
   */
  renew(claim: C): Promise<boolean>
}

/** What a record that is not this attempt's tells a reservation to answer. */
export type RecordState = 'finished' | 'mismatch' | 'busy' | 'free'

/**
 * Reads a key's row the way both protocols must: a finished record answers (replay or mismatch), a live one of
 * another request is a mismatch even while it runs (so a 422 comes before a 409), a live lease is busy, and no
 * row, an expired one, a released one or a lapsed lease leave the key free to claim.
 */
export function recordState(row: LookupRow | undefined, fingerprint: string): RecordState {
  if (!row || row.expired) return 'free'
  if (row.status === 'succeeded' || row.status === 'failed_permanent') return 'finished'
  if (row.fingerprint !== fingerprint) return 'mismatch'
  if (row.status === 'in_progress' && (row.lease_remaining_ms ?? 0) > 0) return 'busy'
  return 'free'
}

/**
 * What a key's row tells an attempt that may not take the key (see {@link recordState}): `free` when it does not
 * stop the attempt, otherwise the answer. A row in progress under a live lease says how long its holder has run
 * and its lease.
 */
export function inspectionOf(row: LookupRow | undefined, fingerprint: string): Inspection {
  const state = recordState(row, fingerprint)
  if (state === 'finished') return { kind: 'finished', row: row as LookupRow }
  if (state === 'busy') {
    return {
      kind: 'busy',
      heldForMs: row?.held_ms ?? null,
      leaseRemainingMs: row?.lease_remaining_ms ?? null,
    }
  }
  return state === 'free' ? FREE : MISMATCH
}

// The answers that carry nothing but their kind, once: a new key is free on every first execution.
const FREE: Inspection = Object.freeze({ kind: 'free' })
const MISMATCH: Inspection = Object.freeze({ kind: 'mismatch' })
