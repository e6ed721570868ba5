// What the engine answers without running the handler: from a key's record as the store found it (or as the replay
// cache remembers it), and when the store failed. One place, whether a request found the key taken, peeked, or an
// attempt lost its key.
import type { Database } from '../store/database.js'
import type { LookupRow } from '../store/queries.js'
import type { Inspection } from '../store/reservation.js'
import type { EngineEvents } from './events.js'
import type { ReplayCache } from './replay-cache.js'
import { type Durations, estimateRetryAfterMs } from './retry-after.js'
import type { KeyId, Outcome, StoredResponse } from './types.js'

/** Local instants taken just before a statement was sent: the start of a database-measured remaining lifetime. */
export interface Sent {
  at: number
  wall: number
}

export const sentNow = (): Sent => ({ at: performance.now(), wall: Date.now() })

/** What a finished record answers with. */
export interface Finished {
  fingerprint: string
  response: StoredResponse
}

/** What was found of a key: what the store found (see `Inspection`), or the replay cache's finished record. */
export type Found = Inspection | { kind: 'cached'; record: Finished }

/**
 * Who asks: a request that does not hold the key (it found the key taken, or peeked), or an attempt that lost it,
 * which answers a key found busy or free with `whenBusy`: `lease_expired` when its lease ran out, `in_progress`
 * when it found another attempt on the key as it came to store its failure.
 */
export type Asker =
  | { kind: 'request'; sent: Sent }
  | {
      kind: 'lost'
      sent: Sent
      attempt: number
      leaseMs: number
      whenBusy: 'in_progress' | 'lease_expired'
    }

/** The `Retry-After` of an attempt that lost its lease: nothing holds the key for it any more. */
const LEASE_EXPIRED_RETRY_AFTER_MS = 1_000

type Busy = Extract<Inspection, { kind: 'busy' }>

const UNKNOWN_HOLDER: Busy = { kind: 'busy', heldForMs: null, leaseRemainingMs: null }

function storedFromRow(row: LookupRow): StoredResponse {
  return {
    status: row.response_status ?? 200,
    headers: row.response_headers ?? {},
    body: asBuffer(row.response_body),
  }
}

/**
 * The stored body as the Buffer `StoredResponse` promises: node-postgres reads bytea as a Buffer, but other drivers
 * (PGlite, postgres.js) as a plain Uint8Array, whose `toString('utf8')` joins the byte values instead of decoding.
 */
function asBuffer(body: Uint8Array | null): Buffer {
  if (body === null) return Buffer.alloc(0)
  return Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength)
}

/** The engine's answers that are not an execution; one per engine. */
export class Answers<Tx> {
  /** Whether a mistake the datasource adapted to has been told: once per engine, on console.error without onEvent. */
  #toldAdapted = false

  constructor(
    private readonly unavailableRetryAfterMs: number,
    private readonly database: Database<Tx>,
    private readonly cache: ReplayCache | undefined,
    private readonly durations: Durations,
    private readonly events: EngineEvents,
  ) {}

  /**
   * What a key's record answers: a finished record its response (remembered until, conservatively before, it
   * expires) or a mismatch for another fingerprint, another request's live record a mismatch, a holder a 409 whose
   * `Retry-After` estimates the holder's remaining time (or, to an attempt whose lease ran out, `lease_expired`);
   * `null` when the key is free for a request to reserve.
   */
  answerInspection(id: KeyId, fingerprint: string, found: Found, asker: Asker): Outcome | null {
    const emit = this.events.emit
    const lost = asker.kind === 'lost'
    switch (found.kind) {
      case 'cached':
        return this.#answerFinished(id, fingerprint, found.record, false)
      case 'finished': {
        const { row } = found
        const record = { fingerprint: row.fingerprint, response: storedFromRow(row) }
        const { sent } = asker
        this.cache?.set(
          id,
          record.fingerprint,
          record.response,
          row.expires_in_ms,
          sent.at,
          sent.wall,
          row.server,
        )
        return this.#answerFinished(id, fingerprint, record, lost)
      }
      case 'mismatch':
        emit?.({ type: 'mismatch', ...id })
        return { kind: 'mismatch' }
      case 'free':
        // To an attempt that lost its key, a key found free is busy: the attempt that freed it may be on its way.
        if (!lost) return null
        return this.#busy(id, UNKNOWN_HOLDER, asker)
      case 'busy':
        return this.#busy(id, found, asker)
    }
  }

  #busy(id: KeyId, holder: Busy, asker: Asker): Outcome {
    const emit = this.events.emit
    if (asker.kind === 'lost' && asker.whenBusy === 'lease_expired') {
      const { attempt, leaseMs } = asker
      emit?.({ type: 'lease_expired', attempt, leaseMs, ...id })
      return { kind: 'lease_expired', retryAfterMs: LEASE_EXPIRED_RETRY_AFTER_MS, attempt, leaseMs }
    }
    const retryAfterMs = estimateRetryAfterMs(holder, this.durations.typical(id.operation))
    emit?.({ type: 'in_progress', retryAfterMs, ...id })
    return { kind: 'in_progress', retryAfterMs }
  }

  /** Answers from a finished record: its response, or a mismatch for another fingerprint. */
  #answerFinished(id: KeyId, fingerprint: string, record: Finished, fencedOut: boolean): Outcome {
    if (record.fingerprint !== fingerprint) {
      this.events.emit?.({ type: 'mismatch', ...id })
      return { kind: 'mismatch' }
    }
    this.events.emit?.({ type: 'replayed', status: record.response.status, ...id })
    return { kind: 'replayed', response: record.response, fencedOut }
  }

  unavailable(error: unknown): Outcome {
    return { kind: 'unavailable', retryAfterMs: this.unavailableRetryAfterMs, error }
  }

  /**
   * A finished record can only vanish before its expiry with the database's own past: a failover to a standby that
   * never received its commit (asynchronous replication), a restore. Both first break the connections, so losing
   * them empties the replay cache and every answer is asked of the database again.
   */
  storeLost(): void {
    this.cache?.clear()
  }

  /** Reports a store error, diagnosed first (a transaction-mode pooler is named, and adapted to, here). */
  storeError(error: unknown, id?: KeyId): unknown {
    return this.diagnosed(error, id).error
  }

  /** {@link Answers.storeError}, and whether the datasource adapted to what failed (then a retry may pass). */
  diagnosed(error: unknown, id?: KeyId): { error: unknown; adapted: boolean } {
    this.storeLost()
    const diagnosis = this.database.diagnose?.(error)
    const reported = diagnosis?.error ?? error
    this.events.emit?.({ type: 'store_error', error: reported, ...id })
    if (diagnosis?.adapted && !this.#toldAdapted) {
      this.#toldAdapted = true
      if (!this.events.toApplication) console.error(diagnosis.error.message)
    }
    return { error: reported, adapted: diagnosis?.adapted === true }
  }
}
