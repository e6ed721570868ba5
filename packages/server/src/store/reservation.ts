// The one seam between the engine's attempt runner and the two ways a key can be reserved in Postgres ('row' and
// 'lock'). The runner owns everything an attempt does around the handler (the transaction's life, rollback,
// classification, size checks, events, the replay cache, the bounded wait); a protocol owns only the SQL of
// claiming, finishing, failing and releasing a key.
import type pg from 'pg'
import type { StoredResponse } from '../engine/types.js'
import type { LookupRow, RecordId } from './queries.js'

/** What one attempt asks to reserve. */
export interface ReserveRequest {
  id: RecordId
  fingerprint: string
  leaseMs: number
  retentionMs: number
  requestHeaders: Record<string, string> | null
}

/** A key this attempt holds. Its business transaction is open on `client` (with the lease guard armed). */
export interface Claim {
  readonly request: ReserveRequest
  readonly client: pg.PoolClient
  /** 1 for the first execution of the key, then 2, 3... (see `ExecutionContext.attempt`). */
  readonly attempt: number
  /** The recovery point an earlier attempt saved, or null. */
  readonly recoveryPoint: string | null
  /** What the claim replaced: an expired record, or an attempt that stopped holding the key (a takeover). */
  readonly replaced: 'expired' | 'takeover' | null
  /** Milliseconds from before the reservation was sent until the finished record will expire (replay cache). */
  readonly expiresInMs: number
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
 * Where a statement that follows an attempt's business transaction runs: the attempt's own client, idle again once
 * the transaction ended, or (once the attempt gave a broken client back) the pool. Never a second connection while
 * the attempt holds one: with every connection held by attempts waiting for another, nothing would answer again.
 */
export type Connection = pg.ClientBase | pg.Pool

/**
 * One reservation protocol. Every method that is handed a claim acts only while the claim still holds the key
 * (fenced): a claim that lost its key meanwhile gets `false` and changes nothing.
 */
export interface ReservationProtocol<C extends Claim = Claim> {
  /**
   * Connects and reserves. When claimed, the business transaction is open on the claim's client, which the caller
   * then owns. Otherwise the client is already back in the pool. Rejects when the store fails.
   */
  reserve(request: ReserveRequest): Promise<Reservation<C>>
  /** What a reservation would find, without claiming or writing anything, on `on`. Rejects when the store fails. */
  inspect(request: ReserveRequest, on: Connection): Promise<Inspection>
  /** Writes the finished record and commits, in the business transaction. False when fenced out (still open). */
  complete(claim: C, status: 'succeeded' | 'failed_permanent', response: StoredResponse): Promise<boolean>
  /**
   * Stores a permanent failure after the business transaction was rolled back, on the claim's client (idle again).
   * False when fenced out. The client is outside any transaction when it settles, whatever the answer.
   */
  fail(claim: C, response: StoredResponse): Promise<boolean>
  /** Frees the key after the business transaction was rolled back, on `on`, so the next attempt runs at once. */
  release(claim: C, on: Connection): Promise<void>
  /**
   * Saves a recovery point, committed at once on the side lane (or with `tx`'s transaction). False when fenced out.
   */
  saveRecoveryPoint(claim: C, point: string, tx?: pg.ClientBase): Promise<boolean>
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
