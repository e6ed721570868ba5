// The engine: one attempt runner over a reservation protocol (store/row-reservation.ts or
// store/lock-reservation.ts). Everything an attempt does around the handler is written here once: answering from
// the record or the replay cache, the bounded wait, the handler in the business transaction, rollback,
// classification, the size and 5xx checks, the completion, events and the cleanup of the connection.
import { createHash } from 'node:crypto'
import { performance } from 'node:perf_hooks'
import { canonicalJson } from '@oncely/protocol'
import type pg from 'pg'
import { ResponseTooLargeError } from '../errors.js'
import { ENGINE_SIGNALS, type EngineSignal, type Observable } from '../hooks.js'
import { detectPooler } from '../store/connection.js'
import { lockReservation } from '../store/lock-reservation.js'
import { resolveStore } from '../store/postgres-store.js'
import * as q from '../store/queries.js'
import type { Claim, ReservationProtocol, ReserveRequest } from '../store/reservation.js'
import { rowReservation } from '../store/row-reservation.js'
import { reapBatch } from '../store/shards.js'
import { verifyStore } from '../store/verify.js'
import { defaultClassify, defaultRenderError } from './classify.js'
import { failOpenReservation } from './fail-open.js'
import type { FaultOptions } from './faults.js'
import { LazyAbort } from './lazy-abort.js'
import { checkInput, checkRecordId, positiveInteger, resolveOptions } from './options.js'
import { ReplayCache } from './replay-cache.js'
import { normalizeResponse } from './response.js'
import type {
  Engine,
  EngineEvent,
  EngineOptions,
  ExecuteInput,
  ExecutionContext,
  KeyId,
  Outcome,
  ReaperOptions,
  ReapOptions,
  StoredResponse,
} from './types.js'
import { boundedWait } from './wait.js'

// A reservation can lose a race against a concurrent release or reap and find the row gone or free; it then simply
// tries again. This bounds those retries (each is a real state change by someone else, so it converges fast).
const MAX_RACE_ROUNDS = 8

// One 'error' listener per pool, fanned out to every engine on it (so many engines do not trip MaxListeners).
const poolErrorListeners = new WeakMap<pg.Pool, Set<(error: Error) => void>>()
function onPoolError(pool: pg.Pool, listener: (error: Error) => void): void {
  let listeners = poolErrorListeners.get(pool)
  if (!listeners) {
    const set = new Set<(error: Error) => void>()
    listeners = set
    poolErrorListeners.set(pool, set)
    pool.on('error', (error) => {
      for (const notify of set) notify(error)
    })
  }
  listeners.add(listener)
}

/** Local instants taken just before a statement was sent: the start of a database-measured remaining lifetime. */
interface Sent {
  at: number
  wall: number
}

/** What a finished record answers with. */
interface Finished {
  fingerprint: string
  response: StoredResponse
}

/**
 * A deterministic key for one external call of an execution: SHA-256 (hex) over the canonical JSON of
 * `[scope, operation, key, step]`. It is what `ctx.stepKey(step)` returns, exported so code outside the handler (a
 * reconciliation job, a support tool) can find the provider's record of a step.
 *
 * @example
 * const chargeKey = stepKeyFor('tenant_1', 'POST /v1/payments', 'order-17', 'charge')
 * await stripe.charges.list({ idempotency_key: chargeKey }) // what the provider did for that step
 */
export function stepKeyFor(scope: string, operation: string, key: string, step: string): string {
  return createHash('sha256')
    .update(canonicalJson([scope, operation, key, step]))
    .digest('hex')
}

function storedFromRow(row: q.LookupRow): StoredResponse {
  return {
    status: row.response_status ?? 200,
    headers: row.response_headers ?? {},
    body: row.response_body ?? Buffer.alloc(0),
  }
}

type ReleaseReason = 'error' | 'server_error_response' | 'response_too_large'

/**
 * Creates the idempotency engine: reserve the key, run the handler in the business transaction on the same
 * connection, write the finished record fenced in that transaction and commit; or answer from the record (or from
 * the in-process cache of finished records).
 *
 * @example
 * const engine = createEngine({ store: postgresStore({ pool }) })
 * const outcome = await engine.execute({ scope, operation: 'POST /v1/payments', key, fingerprint, handler })
 */
export function createEngine(options: EngineOptions): Engine {
  return buildEngine(options, {})
}

/** The engine with fault injection (see `@oncely/server/testing`). */
export function buildEngine(options: EngineOptions, faults: FaultOptions): Engine {
  const config = resolveOptions(options, faults)
  const store = resolveStore(options.store)
  const { pool } = store
  const hooks = faults.hooks ?? {}
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

  const protocol: ReservationProtocol =
    config.reservation === 'lock'
      ? lockReservation(store, config.fenced)
      : rowReservation(store, config.fenced)
  const failingOpen = failOpenReservation(pool)
  const cache = config.replayCache ? new ReplayCache(config.replayCache) : undefined
  // A finished record can only vanish before its expiry with the database's own past: a failover to a standby that
  // never received its commit (asynchronous replication), a restore. Both first break the connections, so losing
  // them empties the cache and every answer is asked of the database again.
  const storeLost = () => cache?.clear()
  onPoolError(pool, (error) => {
    storeLost()
    emit?.({ type: 'store_error', error })
  })

  const unavailable = (error: unknown): Outcome => ({
    kind: 'unavailable',
    retryAfterMs: config.unavailableRetryAfterMs,
    error,
  })
  /** Reports a store error, diagnosed first (a transaction-mode pooler is named, and adapted to, here). */
  const storeError = (error: unknown, id?: KeyId): unknown => {
    storeLost()
    const diagnosed = detectPooler(store, error) ?? error
    emit?.({ type: 'store_error', error: diagnosed, ...id })
    return diagnosed
  }

  async function execute(input: ExecuteInput): Promise<Outcome> {
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
    for (let round = 0; ; ) {
      const sent: Sent = { at: performance.now(), wall: Date.now() }
      let reservation: Awaited<ReturnType<ReservationProtocol['reserve']>>
      try {
        reservation = await protocol.reserve(request)
      } catch (error) {
        const diagnosed = storeError(error, id)
        if (!input.failOpen) return unavailable(diagnosed)
        return failOpen(input, request)
      }
      switch (reservation.kind) {
        case 'claimed':
          return run(input, protocol, reservation.claim, sent)
        case 'finished':
          return answerFinished(id, input.fingerprint, remember(id, reservation.row, sent), false)
        case 'mismatch':
          emit?.({ type: 'mismatch', ...id })
          return { kind: 'mismatch' }
        case 'raced':
          if (++round < MAX_RACE_ROUNDS) continue
          return { kind: 'in_progress', retryAfterMs: 1_000, fencedOut: false }
        case 'busy':
          if (await waited()) continue
          emit?.({ type: 'conflict', retryAfterMs: reservation.retryAfterMs, ...id })
          return { kind: 'in_progress', retryAfterMs: reservation.retryAfterMs, fencedOut: false }
      }
    }
  }

  /** Runs the handler without a key record, when the store failed and the input allows it (`failOpen`). */
  async function failOpen(input: ExecuteInput, request: ReserveRequest): Promise<Outcome> {
    let reservation: Awaited<ReturnType<typeof failingOpen.reserve>>
    try {
      reservation = await failingOpen.reserve(request)
    } catch (error) {
      return unavailable(error)
    }
    return run(input, failingOpen, reservation.claim, { at: performance.now(), wall: Date.now() })
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

  /** Turns a finished row into a response and remembers it until (conservatively before) it expires. */
  function remember(id: KeyId, row: q.LookupRow, sent: Sent): Finished {
    const record = { fingerprint: row.fingerprint, response: storedFromRow(row) }
    cache?.set(id, record.fingerprint, record.response, row.expires_in_ms, sent.at, sent.wall)
    return record
  }

  /** One attempt on a claimed key: the handler in the business transaction, then the finished record. */
  async function run<C extends Claim>(
    input: ExecuteInput,
    reservation: ReservationProtocol<C>,
    claim: C,
    sent: Sent,
  ): Promise<Outcome> {
    const { client, attempt } = claim
    const { id } = claim.request
    const failedOpen = reservation === failingOpen
    if (claim.replaced === 'expired') emit?.({ type: 'expired', ...id })
    else if (claim.replaced === 'takeover') emit?.({ type: 'takeover', attempt, ...id })
    if (!failedOpen) emit?.({ type: 'reserved', attempt, ...id })

    const started = Date.now()
    const abort = new LazyAbort()
    let broken: Error | undefined
    const onClientError = (error: Error) => {
      storeLost()
      // The first error says why (Postgres's own, such as the lease guard's 25P03); the socket's close follows it.
      broken ??= error
      abort.abort(error)
      emit?.({ type: 'store_error', error, ...id })
    }
    client.on('error', onClientError)
    let open = true
    const rollback = async () => {
      if (!open) return
      open = false
      try {
        await client.query('ROLLBACK')
      } catch (error) {
        broken ??= error as Error
      }
    }
    const released = async (
      reason: ReleaseReason,
      detail: { error?: unknown; response?: StoredResponse },
    ) => {
      await rollback()
      try {
        await reservation.release(claim)
        emit?.({ type: 'released', attempt, reason, ...id })
      } catch (error) {
        // The key stays held until its lease runs out; then the next attempt takes over.
        storeError(error, id)
      }
      return { kind: 'retryable_failure', reason, ...detail } as const
    }
    // Postgres ended the transaction after it sat idle past the lease: nothing of this attempt committed, and another
    // may hold the key by now. Free what the claim left (fenced), then answer like any attempt that lost its key.
    const lost = async () => {
      open = false
      await reservation.release(claim).catch(() => {})
      return fencedOut(claim)
    }
    const executed = (response: StoredResponse, status: 'succeeded' | 'failed_permanent'): Outcome => {
      emit?.({ type: 'executed', attempt, status: response.status, durationMs: Date.now() - started, ...id })
      return { kind: 'executed', response, status, attempt, ...(failedOpen ? { failedOpen } : {}) }
    }

    let crashed: unknown
    try {
      await hooks.afterReserve?.({ ...id, attempt, tx: client })
      const ctx: ExecutionContext = {
        tx: client,
        ...id,
        attempt,
        recoveryPoint: claim.recoveryPoint,
        saveRecoveryPoint: (point, tx) => reservation.saveRecoveryPoint(claim, point, tx),
        stepKey: (step) => stepKeyFor(id.scope, id.operation, id.key, step),
        get signal() {
          return abort.signal
        },
      }

      let response: StoredResponse
      try {
        response = normalizeResponse(await input.handler(ctx), config.replayHeaders)
      } catch (error) {
        if (q.isLeaseLost(broken)) return await lost()
        await rollback()
        const kind = broken ? 'retryable' : (input.classify ?? defaultClassify)(error)
        if (kind === 'retryable') return await released('error', { error })
        const stored = normalizeResponse(
          (input.renderError ?? defaultRenderError)(error),
          config.replayHeaders,
        )
        let stores: boolean
        try {
          stores = await reservation.fail(claim, stored)
        } catch (failure) {
          return unavailable(storeError(failure, id))
        }
        return stores ? executed(stored, 'failed_permanent') : await fencedOut(claim)
      }
      if (response.status >= 500) return await released('server_error_response', { response })
      if (response.body.length > config.maxResponseBytes) {
        const error = new ResponseTooLargeError(response.body.length, config.maxResponseBytes)
        return await released('response_too_large', { error })
      }

      await hooks.beforeCommit?.({ ...id, attempt, tx: client })
      const status = response.status >= 400 ? 'failed_permanent' : 'succeeded'
      let completed: boolean
      try {
        completed = await reservation.complete(claim, status, response)
      } catch (error) {
        // The completion failed, or the commit, which may or may not have happened. Releasing is still safe: it only
        // matches a key still held under this claim, so a committed record is left alone and an uncommitted one is
        // freed at once. The connection is dropped, which also ends any open transaction.
        broken ??= error as Error
        if (q.isLeaseLost(broken)) return await lost()
        open = false
        const diagnosed = storeError(error, id)
        await reservation.release(claim).catch(() => {})
        return unavailable(diagnosed)
      }
      if (!completed) {
        await rollback()
        return await fencedOut(claim)
      }
      open = false
      cache?.set(id, input.fingerprint, response, claim.expiresInMs, sent.at, sent.wall)
      const outcome = executed(response, status)
      await hooks.afterCommit?.({ ...id, attempt })
      return outcome
    } catch (error) {
      crashed = error
      abort.abort(error)
      throw error
    } finally {
      await rollback()
      // A client that broke or sat in an abandoned transaction is destroyed rather than returned to the pool. Our
      // 'error' listener stays attached until the pool has its own again: a checked-out client that emits 'error'
      // with no listener crashes the process (regression: connection-kill.test.ts).
      client.release(broken ?? (crashed === undefined ? undefined : new Error('attempt abandoned')))
      client.off('error', onClientError)
    }
  }

  /** After an attempt lost its key: the record's answer (usually the winner's response), or 409. */
  async function fencedOut(claim: Claim): Promise<Outcome> {
    const { id } = claim.request
    emit?.({ type: 'fenced_out', attempt: claim.attempt, ...id })
    const sent: Sent = { at: performance.now(), wall: Date.now() }
    let found: Awaited<ReturnType<ReservationProtocol['inspect']>>
    try {
      found = await protocol.inspect(claim.request)
    } catch (error) {
      return unavailable(storeError(error, id))
    }
    if (found.kind === 'finished')
      return answerFinished(id, claim.request.fingerprint, remember(id, found.row, sent), true)
    if (found.kind === 'mismatch') {
      emit?.({ type: 'mismatch', ...id })
      return { kind: 'mismatch' }
    }
    const retryAfterMs = found.kind === 'busy' ? found.retryAfterMs : 1_000
    emit?.({ type: 'conflict', retryAfterMs, ...id })
    return { kind: 'in_progress', retryAfterMs, fencedOut: true }
  }

  async function peek(
    input: Pick<ExecuteInput, 'scope' | 'operation' | 'key' | 'fingerprint'>,
  ): Promise<Outcome | null> {
    const id = checkRecordId(input)
    const cached = cache?.get(id)
    if (cached) return answerFinished(id, input.fingerprint, cached, false)
    const sent: Sent = { at: performance.now(), wall: Date.now() }
    const request: ReserveRequest = {
      id,
      fingerprint: input.fingerprint,
      leaseMs: config.leaseMs,
      retentionMs: config.retentionMs,
      requestHeaders: null,
    }
    let found: Awaited<ReturnType<ReservationProtocol['inspect']>>
    try {
      found = await protocol.inspect(request)
    } catch (error) {
      return unavailable(storeError(error, id))
    }
    switch (found.kind) {
      case 'finished':
        return answerFinished(id, input.fingerprint, remember(id, found.row, sent), false)
      case 'mismatch':
        emit?.({ type: 'mismatch', ...id })
        return { kind: 'mismatch' }
      case 'busy':
        emit?.({ type: 'conflict', retryAfterMs: found.retryAfterMs, ...id })
        return { kind: 'in_progress', retryAfterMs: found.retryAfterMs, fencedOut: false }
      case 'free':
        return null
    }
  }

  async function forget(key: KeyId): Promise<boolean> {
    const id = checkRecordId(key)
    cache?.delete(id)
    const deleted = (await pool.query(q.forget(store.names, id))).rowCount ?? 0
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

  const engine: Engine & Required<Observable> = {
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
  return engine
}
