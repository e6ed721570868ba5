// The engine: reserves a key over one reservation protocol (store/row-reservation.ts or store/lock-reservation.ts)
// and runs each claimed attempt (attempt.ts); everything else it answers from the record or the replay cache, in
// one place (answers.ts, `answerInspection`), whether a request asks, peeks, or an attempt lost its key.
import { ENGINE_SIGNALS, type Observable } from '../hooks.js'
import { lockReservation } from '../store/lock-reservation.js'
import { type ResolvedStore, resolveStore } from '../store/postgres-store.js'
import * as q from '../store/queries.js'
import type { Claim, Inspection, ReservationProtocol, ReserveRequest } from '../store/reservation.js'
import { rowReservation } from '../store/row-reservation.js'
import { verifyStore } from '../store/verify.js'
import { Answers, type Sent, sentNow } from './answers.js'
import { Attempt, type AttemptEnvironment } from './attempt.js'
import { EngineEvents } from './events.js'
import { type FailOpenReservation, failOpenReservation } from './fail-open.js'
import type { FaultOptions } from './faults.js'
import { checkRecordId, type ResolvedOptions, reserveRequestOf, resolveOptions } from './options.js'
import { reaper } from './reaper.js'
import { ReplayCache } from './replay-cache.js'
import { ReplicationCheck } from './replication-check.js'
import { Durations, MIN_RETRY_AFTER_MS } from './retry-after.js'
import type { Engine, EngineOptions, ExecuteInput, KeyId, Outcome } from './types.js'
import { boundedWait } from './wait.js'

export { stepKeyFor } from './step-key.js'

// A reservation can lose a race against a concurrent release or reap and find the row gone or free; it then simply
// tries again. This bounds those retries (each is a real state change by someone else, so it converges fast).
const MAX_RACE_ROUNDS = 8

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
  const events = new EngineEvents(options.onEvent)
  const keys = new Keys(config, store, events, faults)
  const { database } = store
  database.onConnectionLost((error) => {
    keys.answers.storeLost()
    events.emit?.({ type: 'store_error', error })
  })
  const reaping = reaper(store, events)
  const engine: Engine<Tx> & Required<Observable> = {
    execute: (input) => keys.execute(input),
    peek: (input) => keys.peek(input),
    async forget(key: KeyId): Promise<boolean> {
      const id = checkRecordId(key)
      keys.cache?.delete(id)
      const deleted = (await database.query(q.forget(store.names, id))).rowCount
      // A replay answered from this process's cache between the delete above and now would have come from before it.
      keys.cache?.delete(id)
      return deleted > 0
    },
    reap: reaping.reap,
    startReaper: reaping.startReaper,
    verify: () => verifyStore(store),
    options: {
      leaseMs: config.leaseMs,
      retentionMs: config.retentionMs,
      maxResponseBytes: config.maxResponseBytes,
      reservation: config.reservation,
    },
    [ENGINE_SIGNALS]: (observer) => events.observe(observer),
  }
  // Not enumerable: the slot is no part of the engine users see (logged, compared, spread); wrapEngine() keeps it.
  Object.defineProperty(engine, ENGINE_SIGNALS, { enumerable: false })
  return engine
}

/** The engine's keys: reserve one and run the attempt, or answer from its record; one per engine. */
class Keys<Tx> {
  readonly cache: ReplayCache | undefined
  readonly answers: Answers<Tx>
  readonly #config: ResolvedOptions
  readonly #protocol: ReservationProtocol<Claim<Tx>>
  readonly #failingOpen: FailOpenReservation<Tx>
  readonly #environment: AttemptEnvironment<Tx>
  readonly #replication: ReplicationCheck | undefined

  constructor(
    config: ResolvedOptions,
    store: ResolvedStore<Tx>,
    events: EngineEvents,
    faults: FaultOptions<Tx>,
  ) {
    const { database } = store
    const cache = config.replayCache ? new ReplayCache(config.replayCache) : undefined
    // Every reservation and inspection tells which server it reached: the replay cache's confirmation.
    const observe = cache ? (server: number, sentAt: number) => cache.confirm(server, sentAt) : undefined
    const durations = new Durations()
    this.cache = cache
    const answers = new Answers(config.unavailableRetryAfterMs, database, cache, durations, events)
    this.answers = answers
    this.#replication = cache
      ? new ReplicationCheck(cache, database, (error) => answers.storeError(error))
      : undefined
    this.#config = config
    this.#protocol =
      config.reservation === 'lock'
        ? lockReservation(store, config.fenced, observe)
        : rowReservation(store, config.fenced, observe)
    this.#failingOpen = failOpenReservation(database)
    this.#environment = {
      config,
      hooks: faults.hooks ?? {},
      database,
      cache,
      durations,
      events,
      answers,
    }
  }

  async execute(input: ExecuteInput<Tx>): Promise<Outcome> {
    const request = reserveRequestOf(input, this.#config)
    const { id, fingerprint } = request
    const cached = this.#cached(id)
    if (cached)
      return this.answers.answerInspection(id, fingerprint, { kind: 'cached', record: cached }, NOW)!
    // The bounded wait of a duplicate, made once the key is found busy, counted from the request's start.
    const startedAt = input.wait ? Date.now() : 0
    let waited: (() => Promise<boolean>) | undefined
    let adaptedRetry = false
    for (let round = 0; ; ) {
      const sent = sentNow()
      let reservation: Awaited<ReturnType<ReservationProtocol<Claim<Tx>>['reserve']>>
      try {
        reservation = await this.#protocol.reserve(request)
      } catch (error) {
        const found = this.answers.diagnosed(error, id)
        // Nothing was reserved: when the datasource adapted to what failed (prepared statements behind a pooler),
        // the request is tried again at once instead of being answered 503.
        if (found.adapted && !adaptedRetry) {
          adaptedRetry = true
          continue
        }
        if (!input.failOpen) return this.answers.unavailable(found.error)
        return this.#failOpen(input, request)
      }
      // `return await`: an async function that returns a promise unawaited settles its own ticks later.
      if (reservation.kind === 'claimed')
        return await this.#run(input, this.#protocol, reservation.claim, sent)
      if (reservation.kind === 'raced') {
        if (++round < MAX_RACE_ROUNDS) continue
        return { kind: 'in_progress', retryAfterMs: MIN_RETRY_AFTER_MS }
      }
      if (reservation.kind === 'busy') {
        waited ??= boundedWait(input.wait?.timeoutMs, startedAt)
        if (await waited()) continue
      }
      return this.answers.answerInspection(id, fingerprint, reservation, { kind: 'request', sent }) as Outcome
    }
  }

  /** The replay cache's entry for `id`, if it may answer (its check of the server's replication kept current). */
  #cached(id: KeyId): ReturnType<ReplayCache['get']> {
    if (!this.cache) return undefined
    this.#replication!.refresh()
    return this.cache.get(id)
  }

  /** Runs the handler without a key record, when the store failed and the input allows it (`failOpen`). */
  async #failOpen(input: ExecuteInput<Tx>, request: ReserveRequest): Promise<Outcome> {
    let reservation: Awaited<ReturnType<FailOpenReservation<Tx>['reserve']>>
    try {
      reservation = await this.#failingOpen.reserve(request)
    } catch (error) {
      return this.answers.unavailable(error)
    }
    return this.#run(input, this.#failingOpen, reservation.claim, sentNow())
  }

  #run<C extends Claim<Tx>>(
    input: ExecuteInput<Tx>,
    on: ReservationProtocol<C>,
    claim: C,
    sent: Sent,
  ): Promise<Outcome> {
    return new Attempt(this.#environment, input, on, claim, sent, on === this.#failingOpen).run()
  }

  async peek(
    input: Pick<ExecuteInput, 'scope' | 'operation' | 'key' | 'fingerprint'>,
  ): Promise<Outcome | null> {
    const id = checkRecordId(input)
    const { fingerprint } = input
    const cached = this.#cached(id)
    if (cached) return this.answers.answerInspection(id, fingerprint, { kind: 'cached', record: cached }, NOW)
    const sent = sentNow()
    const request: ReserveRequest = {
      id,
      fingerprint,
      leaseMs: this.#config.leaseMs,
      retentionMs: this.#config.retentionMs,
      requestHeaders: null,
    }
    const { database } = this.#environment
    let found: Inspection
    try {
      found = await this.#protocol.inspect(request, (statement) => database.query(statement))
    } catch (error) {
      return this.answers.unavailable(this.answers.storeError(error, id))
    }
    return this.answers.answerInspection(id, fingerprint, found, { kind: 'request', sent })
  }
}

/** The asker of an answer from the replay cache, which sends nothing. */
const NOW = { kind: 'request', sent: { at: 0, wall: 0 } } as const
