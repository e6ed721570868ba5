// The engine: reserves a key over one reservation protocol (store/row-reservation.ts or store/lock-reservation.ts)
// and runs each claimed attempt (attempt.ts); everything else it answers from the record or the replay cache, in
// one place (`answerInspection`), whether a request asks, peeks, or an attempt lost its key.
import { performance } from 'node:perf_hooks'
import { ENGINE_SIGNALS, type EngineSignal, type Observable } from '../hooks.js'
import { lockReservation } from '../store/lock-reservation.js'
import { resolveStore } from '../store/postgres-store.js'
import * as q from '../store/queries.js'
import type { Claim, Inspection, ReservationProtocol, ReserveRequest } from '../store/reservation.js'
import { rowReservation } from '../store/row-reservation.js'
import { reapBatch } from '../store/shards.js'
import { verifyStore } from '../store/verify.js'
import { Attempt, type AttemptEnvironment, type Sent, sentNow } from './attempt.js'
import { failOpenReservation } from './fail-open.js'
import type { FaultOptions } from './faults.js'
import { checkInput, checkRecordId, positiveInteger, resolveOptions } from './options.js'
import { ReplayCache } from './replay-cache.js'
import { Durations, estimateRetryAfterMs, MIN_RETRY_AFTER_MS } from './retry-after.js'
import type {
  Engine,
  EngineEvent,
  EngineOptions,
  ExecuteInput,
  KeyId,
  Outcome,
  ReaperOptions,
  ReapOptions,
  StoredResponse,
} from './types.js'
import { boundedWait } from './wait.js'

export { stepKeyFor } from './step-key.js'

// A reservation can lose a race against a concurrent release or reap and find the row gone or free; it then simply
// tries again. This bounds those retries (each is a real state change by someone else, so it converges fast).
const MAX_RACE_ROUNDS = 8

/** What a finished record answers with. */
interface Finished {
  fingerprint: string
  response: StoredResponse
}

function storedFromRow(row: q.LookupRow): StoredResponse {
  return {
    status: row.response_status ?? 200,
    headers: row.response_headers ?? {},
    body: row.response_body ?? Buffer.alloc(0),
  }
}

/**
 * Creates the idempotency engine: reserve the key, run the handler in the business transaction on the same
 * connection, write the finished record fenced in that transaction and commit; or answer from the record (or from
 * the in-process cache of finished records).
 *
 * @example
 * const engine = createEngine({ store: postgresStore({ pool }) })
 * const outcome = await engine.execute({ scope, operation: 'POST /v1/payments', key, fingerprint, handler })
 */
export function createEngine<Tx = import('pg').PoolClient>(options: EngineOptions<Tx>): Engine<Tx> {
  return buildEngine(options, {})
}

/** The engine with fault injection (see `@oncely/server/testing`). */
export function buildEngine<Tx>(options: EngineOptions<Tx>, faults: FaultOptions<Tx>): Engine<Tx> {
  const config = resolveOptions(options, faults)
  const store = resolveStore<Tx>(options.store)
  const { database } = store
  // Observers attached through ENGINE_SIGNALS (`@oncely/server/otel`): none unless telemetry is installed.
  const observers = new Set<(signal: EngineSignal) => void>()
  const signal = (event: EngineSignal) => {
    for (const observe of observers) {
      try {
        observe(event)
      } catch {
        // An observer must not change the outcome of an execution.
      }
    }
  }
  const { onEvent } = options
  const deliver = (event: EngineEvent) => {
    try {
      onEvent?.(event)
    } catch {
      // An observer must not change the outcome of an execution.
    }
    if (observers.size > 0) signal(event)
  }
  // Undefined while nobody listens (no onEvent, no observer), so `emit?.({...})` does not even build the event.
  let emit: ((event: EngineEvent) => void) | undefined = onEvent ? deliver : undefined

  const cache = config.replayCache ? new ReplayCache(config.replayCache) : undefined
  // Every reservation and inspection tells which server it reached: the replay cache's confirmation.
  const observe = cache ? (server: number, sentAt: number) => cache.confirm(server, sentAt) : undefined
  const protocol: ReservationProtocol<Claim<Tx>> =
    config.reservation === 'lock'
      ? lockReservation(store, config.fenced, observe)
      : rowReservation(store, config.fenced, observe)
  const failingOpen = failOpenReservation(database)
  const durations = new Durations()
  // A finished record can only vanish before its expiry with the database's own past: a failover to a standby that
  // never received its commit (asynchronous replication), a restore. Both first break the connections, so losing
  // them empties the cache and every answer is asked of the database again.
  const storeLost = () => cache?.clear()
  database.onConnectionLost((error) => {
    storeLost()
    emit?.({ type: 'store_error', error })
  })

  const unavailable = (error: unknown): Outcome => ({
    kind: 'unavailable',
    retryAfterMs: config.unavailableRetryAfterMs,
    error,
  })
  /** Reports a store error, diagnosed first (a transaction-mode pooler is named, and adapted to, here). */
  const storeError = (error: unknown, id?: KeyId): unknown => diagnosed(error, id).error
  // Whether a mistake the datasource adapted to has been told: once per engine, on console.error without onEvent.
  let toldAdapted = false
  function diagnosed(error: unknown, id?: KeyId): { error: unknown; adapted: boolean } {
    storeLost()
    const diagnosis = database.diagnose?.(error)
    const reported = diagnosis?.error ?? error
    emit?.({ type: 'store_error', error: reported, ...id })
    if (diagnosis?.adapted && !toldAdapted) {
      toldAdapted = true
      if (!onEvent) console.error(diagnosis.error.message)
    }
    return { error: reported, adapted: diagnosis?.adapted === true }
  }

  /** Answers from a finished record: its response, or a mismatch for another fingerprint. */
  function answerFinished(id: KeyId, fingerprint: string, record: Finished, fencedOut: boolean): Outcome {
    if (record.fingerprint !== fingerprint) {
      emit?.({ type: 'mismatch', ...id })
      return { kind: 'mismatch' }
    }
    emit?.({ type: 'replayed', status: record.response.status, ...id })
    return { kind: 'replayed', response: record.response, fencedOut }
  }

  /**
   * What a key's record answers a request that does not hold the key: a finished record its response (remembered
   * until, conservatively before, it expires) or a mismatch, another request's live record a mismatch, a holder a
   * 409 whose `Retry-After` estimates the holder's remaining time; `null` when the key is free.
   */
  function answerInspection(
    id: KeyId,
    fingerprint: string,
    found: Inspection,
    sent: Sent,
    fencedOut: boolean,
  ): Outcome | null {
    switch (found.kind) {
      case 'finished': {
        const { row } = found
        const record = { fingerprint: row.fingerprint, response: storedFromRow(row) }
        cache?.set(id, record.fingerprint, record.response, row.expires_in_ms, sent.at, sent.wall, row.server)
        return answerFinished(id, fingerprint, record, fencedOut)
      }
      case 'mismatch':
        emit?.({ type: 'mismatch', ...id })
        return { kind: 'mismatch' }
      case 'busy': {
        const retryAfterMs = estimateRetryAfterMs(found, durations.typical(id.operation))
        emit?.({ type: 'in_progress', retryAfterMs, ...id })
        return { kind: 'in_progress', retryAfterMs }
      }
      case 'free':
        return null
    }
  }

  const environment: AttemptEnvironment<Tx> = {
    config,
    hooks: faults.hooks ?? {},
    database,
    cache,
    durations,
    emit: () => emit,
    storeError,
    unavailable,
    answerInspection,
  }
  const run = <C extends Claim<Tx>>(
    input: ExecuteInput<Tx>,
    on: ReservationProtocol<C>,
    claim: C,
    sent: Sent,
  ) => new Attempt(environment, input, on, claim, sent, on === failingOpen).run()

  async function execute(input: ExecuteInput<Tx>): Promise<Outcome> {
    const { leaseMs, retentionMs } = checkInput(input, config)
    const id: KeyId = { scope: input.scope, operation: input.operation, key: input.key }
    const cached = cache?.get(id)
    if (cached) return answerFinished(id, input.fingerprint, cached, false)
    const request: ReserveRequest = {
      id,
      fingerprint: input.fingerprint,
      leaseMs,
      retentionMs,
      requestHeaders: input.requestHeaders ?? null,
    }
    const waited = boundedWait(input.wait?.timeoutMs)
    let adaptedRetry = false
    for (let round = 0; ; ) {
      const sent = sentNow()
      let reservation: Awaited<ReturnType<ReservationProtocol<Claim<Tx>>['reserve']>>
      try {
        reservation = await protocol.reserve(request)
      } catch (error) {
        const found = diagnosed(error, id)
        // Nothing was reserved: when the datasource adapted to what failed (prepared statements behind a pooler),
        // the request is tried again at once instead of being answered 503.
        if (found.adapted && !adaptedRetry) {
          adaptedRetry = true
          continue
        }
        if (!input.failOpen) return unavailable(found.error)
        return failOpen(input, request)
      }
      if (reservation.kind === 'claimed') return run(input, protocol, reservation.claim, sent)
      if (reservation.kind === 'raced') {
        if (++round < MAX_RACE_ROUNDS) continue
        return { kind: 'in_progress', retryAfterMs: MIN_RETRY_AFTER_MS }
      }
      if (reservation.kind === 'busy' && (await waited())) continue
      return answerInspection(id, input.fingerprint, reservation, sent, false) as Outcome
    }
  }

  /** Runs the handler without a key record, when the store failed and the input allows it (`failOpen`). */
  async function failOpen(input: ExecuteInput<Tx>, request: ReserveRequest): Promise<Outcome> {
    let reservation: Awaited<ReturnType<typeof failingOpen.reserve>>
    try {
      reservation = await failingOpen.reserve(request)
    } catch (error) {
      return unavailable(error)
    }
    return run(input, failingOpen, reservation.claim, sentNow())
  }

  async function peek(
    input: Pick<ExecuteInput, 'scope' | 'operation' | 'key' | 'fingerprint'>,
  ): Promise<Outcome | null> {
    const id = checkRecordId(input)
    const cached = cache?.get(id)
    if (cached) return answerFinished(id, input.fingerprint, cached, false)
    const sent = sentNow()
    const request: ReserveRequest = {
      id,
      fingerprint: input.fingerprint,
      leaseMs: config.leaseMs,
      retentionMs: config.retentionMs,
      requestHeaders: null,
    }
    let found: Inspection
    try {
      found = await protocol.inspect(request, (statement) => database.query(statement))
    } catch (error) {
      return unavailable(storeError(error, id))
    }
    return answerInspection(id, input.fingerprint, found, sent, false)
  }

  async function forget(key: KeyId): Promise<boolean> {
    const id = checkRecordId(key)
    cache?.delete(id)
    const deleted = (await database.query(q.forget(store.names, id))).rowCount
    // A replay answered from this process's cache between the delete above and now would have come from before it.
    cache?.delete(id)
    return deleted > 0
  }

  async function reap(reapOptions: ReapOptions = {}): Promise<number> {
    const batchSize = positiveInteger('batchSize', reapOptions.batchSize ?? 1_000)
    const maxBatches = positiveInteger('maxBatches', reapOptions.maxBatches ?? 100)
    const started = performance.now()
    let total = 0
    try {
      for (let batch = 0; batch < maxBatches; batch++) {
        const deleted = await reapBatch(store, batchSize)
        total += deleted
        if (deleted < batchSize) break
      }
    } catch (error) {
      signal({ type: 'reaped', deleted: total, durationMs: performance.now() - started, error })
      throw error
    }
    signal({ type: 'reaped', deleted: total, durationMs: performance.now() - started })
    return total
  }

  function startReaper(reaperOptions: ReaperOptions = {}): () => void {
    const intervalMs = positiveInteger('intervalMs', reaperOptions.intervalMs ?? 60_000)
    let running = false
    const timer = setInterval(() => {
      if (running) return
      running = true
      reap(reaperOptions)
        .catch((error) => emit?.({ type: 'store_error', error }))
        .finally(() => {
          running = false
        })
    }, intervalMs)
    timer.unref?.()
    return () => clearInterval(timer)
  }

  const engine: Engine<Tx> & Required<Observable> = {
    execute,
    peek,
    forget,
    reap,
    startReaper,
    verify: () => verifyStore(store),
    options: {
      leaseMs: config.leaseMs,
      retentionMs: config.retentionMs,
      maxResponseBytes: config.maxResponseBytes,
      reservation: config.reservation,
    },
    [ENGINE_SIGNALS]: (observer) => {
      observers.add(observer)
      emit = deliver
      return () => {
        const removed = observers.delete(observer)
        if (!onEvent && observers.size === 0) emit = undefined
        return removed
      }
    },
  }
  // Not enumerable: the slot is no part of the engine users see (logged, compared, spread); wrapEngine() keeps it.
  Object.defineProperty(engine, ENGINE_SIGNALS, { enumerable: false })
  return engine
}
