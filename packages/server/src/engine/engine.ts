import { createHash, randomUUID } from 'node:crypto'
import { performance } from 'node:perf_hooks'
import { canonicalJson } from '@oncely/protocol'
import type pg from 'pg'
import { ResponseTooLargeError } from '../errors.js'
import * as q from '../store/queries.js'
import { verifyStore } from '../store/verify.js'
import { defaultClassify, defaultRenderError } from './classify.js'
import { LazyAbort } from './lazy-abort.js'
import { createLockExecutor } from './lock-mode.js'
import { checkInput, positiveInteger, resolveOptions } from './options.js'
import { ReplayCache } from './replay-cache.js'
import { normalizeResponse } from './response.js'
import type {
  Engine,
  EngineEvent,
  EngineOptions,
  ExecuteInput,
  ExecutionContext,
  Outcome,
  ReaperOptions,
  ReapOptions,
  StoredResponse,
} from './types.js'

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

// Which SQL-level prepared statements each connection holds (module-wide: engines on one table share a name).
const preparedStatements = new WeakMap<pg.ClientBase, Set<string>>()

/**
 * PREPAREs a statement on this connection the first time it is used there: on its own, so whether it exists never
 * depends on which statement of a later message failed (a PREPARE is not undone by a rollback).
 */
async function prepare(client: pg.ClientBase, statement: q.SqlStatement): Promise<void> {
  let prepared = preparedStatements.get(client)
  if (prepared?.has(statement.name)) return
  await client.query(statement.prepare)
  if (!prepared) {
    prepared = new Set()
    preparedStatements.set(client, prepared)
  }
  prepared.add(statement.name)
}

/** Rolls back the transaction the reservation message began and returns the client (destroyed if that fails). */
async function endTransaction(client: pg.PoolClient): Promise<void> {
  try {
    await client.query('ROLLBACK')
    client.release()
  } catch (error) {
    client.release(error as Error)
  }
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** A deterministic per-step key: SHA-256 over the canonical JSON of [scope, operation, key, step]. */
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

/**
 * Creates the idempotency engine: reserve (one autocommit statement), run the handler in a business transaction on
 * the same connection, complete the key with a fenced UPDATE in that transaction, COMMIT; or answer from the
 * record (or from the in-process cache of finished records).
 *
 * @example
 * const engine = createEngine({ store: postgresStore({ pool }) })
 * const outcome = await engine.execute({ scope, operation: 'POST /v1/payments', key, fingerprint, handler })
 */
export function createEngine(options: EngineOptions): Engine {
  const config = resolveOptions(options)
  const { pool, names } = options.store
  const hooks = options.hooks ?? {}
  const emit = (event: EngineEvent) => {
    try {
      options.onEvent?.(event)
    } catch {
      // An observer must not change the outcome of an execution.
    }
  }
  onPoolError(pool, (error) => emit({ type: 'store_error', error }))

  const cache = config.replayCache
    ? new ReplayCache(config.replayCache.maxEntries, config.replayCache.maxBytes)
    : undefined

  const { preparedStatements } = options.store
  const plain = (query: q.Query): q.Query =>
    preparedStatements ? query : { text: query.text, values: query.values }

  /**
   * Reserves on `client`. When it reserved, the business transaction has begun on it (prepared: in the same
   * message; else with its own BEGIN). When not, a transaction may be open: the caller ends it.
   */
  async function reserveOn(
    client: pg.PoolClient,
    id: q.RecordId,
    fingerprint: string,
    token: string,
    leaseMs: number,
    retentionMs: number,
    headers: Record<string, string> | null,
  ): Promise<q.ReserveRow | undefined> {
    if (!preparedStatements) {
      const query = plain(q.reserve(names, id, fingerprint, token, leaseMs, retentionMs, headers))
      const row = (await client.query<q.ReserveRow>(query)).rows[0]
      if (row?.reserved) await client.query('BEGIN')
      return row
    }
    const { statement, text } = q.reserveAndBegin(
      names,
      id,
      fingerprint,
      token,
      leaseMs,
      retentionMs,
      headers,
    )
    await prepare(client, statement)
    // A multi-statement message answers with one result per statement: BEGIN, EXECUTE, COMMIT, BEGIN.
    const results = (await client.query(text)) as unknown as pg.QueryResult<q.ReserveRow>[]
    return results[results.length - 3]?.rows[0]
  }

  /** Completes and commits; false when fenced out (the transaction is then still open: roll back). */
  async function completeOn(
    client: pg.PoolClient,
    id: q.RecordId,
    token: string,
    status: 'succeeded' | 'failed_permanent',
    response: StoredResponse,
  ): Promise<boolean> {
    if (preparedStatements && response.body.length <= q.INLINE_BODY_BYTES) {
      // One round trip: the completion fails on purpose when fenced out, which stops the message before COMMIT.
      const { statement, text } = q.completeAndCommit(names, id, token, status, response, config.fenced)
      await prepare(client, statement)
      try {
        await client.query(text)
      } catch (error) {
        if (q.isFenceError(error)) return false
        throw error
      }
      return true
    }
    const completed = await client.query(plain(q.complete(names, id, token, status, response, config.fenced)))
    if (completed.rowCount !== 1) return false
    await client.query('COMMIT')
    return true
  }

  const executeLocked =
    config.reservation === 'lock'
      ? createLockExecutor({
          pool,
          names,
          preparedStatements,
          config,
          hooks,
          emit,
          prepare,
          endTransaction,
          answerFinished: (id, fingerprint, row, sent) =>
            finished(id, fingerprint, remember(id, row, sent), false),
          remember: (id, fingerprint, response, expiresInMs, sent) =>
            cache?.set(id, fingerprint, response, expiresInMs, sent.at, sent.wall),
          fencedOut: (id, attempt) => fencedOut(id, attempt),
          failOpen: (input) => failOpen(input),
          stepKey: (id, step) => stepKeyFor(id.scope, id.operation, id.key, step),
        })
      : undefined

  async function execute(input: ExecuteInput): Promise<Outcome> {
    const { leaseMs, retentionMs } = checkInput(input, config)
    const id: q.RecordId = { scope: input.scope, operation: input.operation, key: input.key }
    const cached = cache?.get(id)
    if (cached) return finished(id, input.fingerprint, cached, false)
    if (executeLocked) return executeLocked(input, id, leaseMs, retentionMs)
    const deadline = input.wait ? Date.now() + input.wait.timeoutMs : 0
    let pollMs = 25
    for (let round = 0; ; ) {
      const token = randomUUID()
      let reserved: q.ReserveRow | undefined
      let row: q.LookupRow | undefined
      // One connection per attempt: the reservation runs on the client that then runs the business transaction.
      let client: pg.PoolClient | undefined
      const sent: Sent = { at: performance.now(), wall: Date.now() }
      try {
        client = await pool.connect()
        const headers = input.requestHeaders ?? null
        reserved = await reserveOn(client, id, input.fingerprint, token, leaseMs, retentionMs, headers)
        if (reserved && !reserved.reserved) {
          // The snapshot can miss a row committed a moment ago that the INSERT then conflicted with: re-read it.
          row =
            reserved.status === null
              ? (await client.query<q.LookupRow>(plain(q.lookup(names, id)))).rows[0]
              : (reserved as q.LookupRow)
        }
      } catch (error) {
        client?.release(error as Error)
        emit({ type: 'store_error', error, ...id })
        if (input.failOpen) return failOpen(input)
        return { kind: 'unavailable', retryAfterMs: config.unavailableRetryAfterMs, error }
      }
      if (reserved?.reserved) {
        if (!hooks.afterReserve) return run(input, id, token, reserved, client, sent)
        // A pausing hook must not hold a connection (tests pause many attempts on small pools).
        await endTransaction(client)
        return run(input, id, token, reserved, undefined, sent)
      }
      // The reservation message began the business transaction; end it without making the answer wait.
      if (preparedStatements) void endTransaction(client)
      else client.release()
      const raced = !row || row.expired || (row.status === 'in_progress' && row.lease_remaining_ms === 0)
      if (row && !row.expired && row.fingerprint !== input.fingerprint) {
        if (row.status === 'succeeded' || row.status === 'failed_permanent') remember(id, row, sent)
        emit({ type: 'mismatch', ...id })
        return { kind: 'mismatch' }
      }
      if (raced || row?.status === 'failed_retryable') {
        if (++round < MAX_RACE_ROUNDS) continue
        return { kind: 'in_progress', retryAfterMs: 1_000, fencedOut: false }
      }
      if (row?.status === 'in_progress') {
        const remaining = Date.now() + pollMs < deadline
        if (remaining) {
          await sleep(pollMs)
          pollMs = Math.min(pollMs * 2, 500)
          continue
        }
        const retryAfterMs = row.lease_remaining_ms ?? 1_000
        emit({ type: 'conflict', retryAfterMs, ...id })
        return { kind: 'in_progress', retryAfterMs, fencedOut: false }
      }
      return finished(id, input.fingerprint, remember(id, row as q.LookupRow, sent), false)
    }
  }

  /** Answers from a finished record: its response, or a mismatch for another fingerprint. */
  function finished(id: q.RecordId, fingerprint: string, record: Finished, fencedOut: boolean): Outcome {
    if (record.fingerprint !== fingerprint) {
      emit({ type: 'mismatch', ...id })
      return { kind: 'mismatch' }
    }
    emit({ type: 'replayed', status: record.response.status, ...id })
    return { kind: 'replayed', response: record.response, fencedOut }
  }

  /** Turns a finished row into a response and remembers it until (conservatively before) it expires. */
  function remember(id: q.RecordId, row: q.LookupRow, sent: Sent): Finished {
    const record = { fingerprint: row.fingerprint, response: storedFromRow(row) }
    cache?.set(id, record.fingerprint, record.response, row.expires_in_ms, sent.at, sent.wall)
    return record
  }

  async function run(
    input: ExecuteInput,
    id: q.RecordId,
    token: string,
    reserved: q.ReserveRow,
    /** The client the reservation ran on, its business transaction already begun; else connect and BEGIN. */
    inTransaction: pg.PoolClient | undefined,
    sent: Sent,
  ): Promise<Outcome> {
    const attempt = reserved.attempts ?? 1
    // `status` and `expired` describe the row this reservation replaced (as the statement's snapshot saw it).
    if (reserved.expired) emit({ type: 'expired', ...id })
    else if (reserved.status === 'in_progress') emit({ type: 'takeover', attempt, ...id })
    emit({ type: 'reserved', attempt, ...id })
    let client: pg.PoolClient
    if (inTransaction) client = inTransaction
    else {
      await hooks.afterReserve?.({ ...id, attempt })
      try {
        client = await pool.connect()
      } catch (error) {
        return storeFailed(id, token, error)
      }
    }

    const started = Date.now()
    const abort = new LazyAbort()
    let broken: Error | undefined
    const onClientError = (error: Error) => {
      broken = error
      abort.abort(error)
      emit({ type: 'store_error', error, ...id })
    }
    client.on('error', onClientError)
    let crashed: unknown
    const rollback = async () => {
      try {
        await client.query('ROLLBACK')
      } catch (error) {
        broken ??= error as Error
      }
    }

    try {
      try {
        if (!inTransaction) await client.query('BEGIN')
      } catch (error) {
        broken ??= error as Error
        return storeFailed(id, token, error)
      }
      const ctx: ExecutionContext = {
        tx: client,
        ...id,
        attempt,
        recoveryPoint: reserved.recovery_point,
        saveRecoveryPoint: async (point, tx) => {
          const result = await (tx ?? pool).query(q.saveRecoveryPoint(names, id, token, point))
          return result.rowCount === 1
        },
        stepKey: (step) => stepKeyFor(id.scope, id.operation, id.key, step),
        get signal() {
          return abort.signal
        },
      }

      let response: StoredResponse
      try {
        response = normalizeResponse(await input.handler(ctx), config.replayHeaders)
      } catch (error) {
        await rollback()
        const kind = broken ? 'retryable' : (input.classify ?? defaultClassify)(error)
        if (kind === 'retryable') return released(id, token, attempt, 'error', { error })
        const stored = normalizeResponse(
          (input.renderError ?? defaultRenderError)(error),
          config.replayHeaders,
        )
        return completeOutsideTx(id, token, attempt, stored, started)
      }
      if (response.status >= 500) {
        await rollback()
        return released(id, token, attempt, 'server_error_response', { response })
      }
      if (response.body.length > config.maxResponseBytes) {
        await rollback()
        const error = new ResponseTooLargeError(response.body.length, config.maxResponseBytes)
        return released(id, token, attempt, 'response_too_large', { error })
      }

      try {
        await hooks.beforeCommit?.({ ...id, attempt, tx: client })
      } catch (error) {
        crashed = error
        throw error
      }

      const status = response.status >= 400 ? 'failed_permanent' : 'succeeded'
      let completed: boolean
      try {
        completed = await completeOn(client, id, token, status, response)
      } catch (error) {
        // The completion failed, or the commit, which may or may not have happened. Releasing is still safe: it only
        // matches a row still in progress under our token, so a committed completion is left alone and an
        // uncommitted one frees the key at once. The connection is dropped, which also ends any open transaction.
        broken ??= error as Error
        return storeFailed(id, token, error)
      }
      if (!completed) {
        await rollback()
        return fencedOut(id, attempt)
      }
      if (reserved.reserved_expires_in_ms !== null) {
        cache?.set(id, input.fingerprint, response, reserved.reserved_expires_in_ms, sent.at, sent.wall)
      }
      emit({ type: 'executed', attempt, status: response.status, durationMs: Date.now() - started, ...id })
      await hooks.afterCommit?.({ ...id, attempt })
      return { kind: 'executed', response, status, attempt }
    } catch (error) {
      crashed ??= error
      abort.abort(error)
      throw error
    } finally {
      if (crashed !== undefined && !broken) await rollback()
      // A client that broke or sat in an abandoned transaction is destroyed rather than returned to the pool. Our
      // 'error' listener stays attached until the pool has its own again: a checked-out client that emits 'error'
      // with no listener crashes the process (regression: connection-kill.test.ts).
      client.release(broken ?? (crashed === undefined ? undefined : new Error('attempt abandoned')))
      client.off('error', onClientError)
    }
  }

  async function released(
    id: q.RecordId,
    token: string,
    attempt: number,
    reason: 'error' | 'server_error_response' | 'response_too_large',
    detail: { error?: unknown; response?: StoredResponse },
  ): Promise<Outcome> {
    try {
      await pool.query(plain(q.release(names, id, token)))
      emit({ type: 'released', attempt, reason, ...id })
    } catch (error) {
      // The key stays in progress until its lease runs out; then the next attempt takes over.
      emit({ type: 'store_error', error, ...id })
    }
    return { kind: 'retryable_failure', reason, ...detail }
  }

  async function completeOutsideTx(
    id: q.RecordId,
    token: string,
    attempt: number,
    response: StoredResponse,
    started: number,
  ): Promise<Outcome> {
    let rowCount: number | null
    try {
      rowCount = (
        await pool.query(plain(q.complete(names, id, token, 'failed_permanent', response, config.fenced)))
      ).rowCount
    } catch (error) {
      emit({ type: 'store_error', error, ...id })
      return { kind: 'unavailable', retryAfterMs: config.unavailableRetryAfterMs, error }
    }
    if (rowCount !== 1) return fencedOut(id, attempt)
    emit({ type: 'executed', attempt, status: response.status, durationMs: Date.now() - started, ...id })
    return { kind: 'executed', response, status: 'failed_permanent', attempt }
  }

  async function fencedOut(id: q.RecordId, attempt: number): Promise<Outcome> {
    emit({ type: 'fenced_out', attempt, ...id })
    let row: q.LookupRow | undefined
    const sent: Sent = { at: performance.now(), wall: Date.now() }
    try {
      row = (await pool.query<q.LookupRow>(plain(q.lookup(names, id)))).rows[0]
    } catch (error) {
      emit({ type: 'store_error', error, ...id })
      return { kind: 'unavailable', retryAfterMs: config.unavailableRetryAfterMs, error }
    }
    if (row && (row.status === 'succeeded' || row.status === 'failed_permanent')) {
      const { response } = remember(id, row, sent)
      emit({ type: 'replayed', status: response.status, ...id })
      return { kind: 'replayed', response, fencedOut: true }
    }
    const retryAfterMs = row?.lease_remaining_ms || 1_000
    emit({ type: 'conflict', retryAfterMs, ...id })
    return { kind: 'in_progress', retryAfterMs, fencedOut: true }
  }

  async function storeFailed(id: q.RecordId, token: string, error: unknown): Promise<Outcome> {
    emit({ type: 'store_error', error, ...id })
    await pool.query(plain(q.release(names, id, token))).catch(() => {})
    return { kind: 'unavailable', retryAfterMs: config.unavailableRetryAfterMs, error }
  }

  async function failOpen(input: ExecuteInput): Promise<Outcome> {
    let client: pg.PoolClient
    try {
      client = await pool.connect()
    } catch (error) {
      return { kind: 'unavailable', retryAfterMs: config.unavailableRetryAfterMs, error }
    }
    let broken: Error | undefined
    const onClientError = (error: Error) => {
      broken = error
    }
    client.on('error', onClientError)
    const abort = new LazyAbort()
    try {
      await client.query('BEGIN')
      const raw = await input.handler({
        tx: client,
        scope: input.scope,
        operation: input.operation,
        key: input.key,
        attempt: 1,
        recoveryPoint: null,
        saveRecoveryPoint: async () => false,
        stepKey: (step) => stepKeyFor(input.scope, input.operation, input.key, step),
        get signal() {
          return abort.signal
        },
      })
      const response = normalizeResponse(raw, config.replayHeaders)
      await client.query(response.status >= 500 ? 'ROLLBACK' : 'COMMIT')
      return { kind: 'executed', response, status: 'succeeded', attempt: 1, failedOpen: true }
    } catch (error) {
      await client.query('ROLLBACK').catch(() => {})
      return { kind: 'retryable_failure', reason: 'error', error }
    } finally {
      client.release(broken)
      client.off('error', onClientError)
    }
  }

  async function reap(reapOptions: ReapOptions = {}): Promise<number> {
    const batchSize = positiveInteger('batchSize', reapOptions.batchSize ?? 1_000)
    const maxBatches = positiveInteger('maxBatches', reapOptions.maxBatches ?? 100)
    let total = 0
    for (let batch = 0; batch < maxBatches; batch++) {
      const deleted = (await pool.query(q.reap(names, batchSize))).rowCount ?? 0
      total += deleted
      if (deleted < batchSize) break
    }
    return total
  }

  function startReaper(reaperOptions: ReaperOptions = {}): () => void {
    const intervalMs = positiveInteger('intervalMs', reaperOptions.intervalMs ?? 60_000)
    let running = false
    const timer = setInterval(() => {
      if (running) return
      running = true
      reap(reaperOptions)
        .catch((error) => emit({ type: 'store_error', error }))
        .finally(() => {
          running = false
        })
    }, intervalMs)
    timer.unref?.()
    return () => clearInterval(timer)
  }

  return {
    execute,
    reap,
    startReaper,
    verify: () => verifyStore(options.store),
    options: {
      leaseMs: config.leaseMs,
      retentionMs: config.retentionMs,
      maxResponseBytes: config.maxResponseBytes,
    },
  }
}
