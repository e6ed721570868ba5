// The `reservation: 'lock'` protocol: the key is reserved by a transaction-scoped advisory lock taken in the
// business transaction's first round trip, and the finished record is written by one fenced upsert sent with the
// COMMIT. One commit and three round trips per new key, like the bare transaction; see the package README,
// "Choosing a reservation protocol".
import { randomUUID } from 'node:crypto'
import { performance } from 'node:perf_hooks'
import type pg from 'pg'
import { ResponseTooLargeError } from '../errors.js'
import type { TableNames } from '../store/identifiers.js'
import * as lq from '../store/lock-queries.js'
import * as q from '../store/queries.js'
import { defaultClassify, defaultRenderError } from './classify.js'
import { LazyAbort } from './lazy-abort.js'
import type { ResolvedOptions } from './options.js'
import { normalizeResponse } from './response.js'
import type {
  EngineEvent,
  EngineHooks,
  ExecuteInput,
  ExecutionContext,
  Outcome,
  StoredResponse,
} from './types.js'

/** Local instants taken just before a statement was sent (see engine.ts). */
export interface Sent {
  at: number
  wall: number
}

/** What the lock-mode executor borrows from the engine it belongs to. */
export interface LockModeDeps {
  pool: pg.Pool
  names: TableNames
  preparedStatements: boolean
  config: ResolvedOptions
  hooks: EngineHooks
  emit(event: EngineEvent): void
  prepare(client: pg.ClientBase, statement: q.SqlStatement): Promise<void>
  endTransaction(client: pg.PoolClient): Promise<void>
  /** Answers from a finished row (replay or mismatch), caching it. */
  answerFinished(id: q.RecordId, fingerprint: string, row: q.LookupRow, sent: Sent): Outcome
  /** Caches the response this process just committed. */
  remember(
    id: q.RecordId,
    fingerprint: string,
    response: StoredResponse,
    expiresInMs: number,
    sent: Sent,
  ): void
  /** After a fenced-out finish: reads the record and answers with the winner's response, or 409. */
  fencedOut(id: q.RecordId, attempt: number): Promise<Outcome>
  failOpen(input: ExecuteInput): Promise<Outcome>
  stepKey(id: q.RecordId, step: string): string
}

/** Retry-After for a duplicate that found the lock held: the holder's progress is not recorded anywhere. */
const LOCK_HELD_RETRY_AFTER_MS = 1_000

const NO_TOKEN = '00000000-0000-0000-0000-000000000000'

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

const isFinished = (row: lq.LockedLookupRow) =>
  row.status === 'succeeded' || row.status === 'failed_permanent'

export function createLockExecutor(deps: LockModeDeps) {
  const { pool, names, preparedStatements, config, hooks, emit } = deps

  /** BEGINs on `client`, takes the key's advisory lock and reads its row (one round trip when prepared). */
  async function lockAndLookup(
    client: pg.PoolClient,
    id: q.RecordId,
  ): Promise<{ locked: boolean; row: lq.LockedLookupRow | undefined }> {
    let answer: lq.LockedLookup | undefined
    if (!preparedStatements) {
      await client.query('BEGIN')
      answer = (await client.query<lq.LockedLookup>(lq.lockAndLookupQuery(names, id))).rows[0]
    } else {
      const { statement, text } = lq.beginLockAndLookup(names, id)
      await deps.prepare(client, statement)
      const results = (await client.query(text)) as unknown as pg.QueryResult<lq.LockedLookup>[]
      answer = results[1]?.rows[0]
    }
    return {
      locked: answer?.locked === true,
      row: answer?.status == null ? undefined : (answer as lq.LockedLookupRow),
    }
  }

  /** Writes the finished record and commits; throws a fence error (see q.isFenceError) when the row changed. */
  async function finishOn(client: pg.PoolClient, id: q.RecordId, record: lq.FinishRecord): Promise<void> {
    if (preparedStatements && record.response.body.length <= q.INLINE_BODY_BYTES) {
      const { statement, text } = lq.finishAndCommit(names, id, record, config.fenced)
      await deps.prepare(client, statement)
      await client.query(text)
      return
    }
    const query = lq.finishQuery(names, id, record, config.fenced)
    await client.query(preparedStatements ? query : { text: query.text, values: query.values })
    await client.query('COMMIT')
  }

  /**
   * Runs `input` under the lock protocol. `storeOnly` stores a rendered permanent error instead of running the
   * handler (after the handler's transaction was rolled back, the lock must be taken again to store it).
   */
  async function executeLocked(
    input: ExecuteInput,
    id: q.RecordId,
    leaseMs: number,
    retentionMs: number,
    storeOnly?: { response: StoredResponse; token: string | undefined },
  ): Promise<Outcome> {
    const deadline = input.wait ? Date.now() + input.wait.timeoutMs : 0
    let pollMs = 25
    for (;;) {
      const sent: Sent = { at: performance.now(), wall: Date.now() }
      let client: pg.PoolClient | undefined
      let locked: boolean
      let row: lq.LockedLookupRow | undefined
      try {
        client = await pool.connect()
        ;({ locked, row } = await lockAndLookup(client, id))
      } catch (error) {
        client?.release(error as Error)
        emit({ type: 'store_error', error, ...id })
        if (input.failOpen && !storeOnly) return deps.failOpen(input)
        return { kind: 'unavailable', retryAfterMs: config.unavailableRetryAfterMs, error }
      }
      const live = row && !row.expired ? row : undefined
      // A live lease is another attempt's, unless it carries the token of the attempt storing its error.
      const held =
        live?.status === 'in_progress' &&
        (live.lease_remaining_ms ?? 0) > 0 &&
        !(storeOnly?.token !== undefined && live.lock_token === storeOnly.token)
      if (locked && !held && !(live && (live.fingerprint !== input.fingerprint || isFinished(live)))) {
        return run(client, input, id, leaseMs, retentionMs, row, sent, storeOnly)
      }
      // Not ours to run: end the transaction without making the answer wait.
      void deps.endTransaction(client)
      if (live && (live.fingerprint !== input.fingerprint || isFinished(live))) {
        if (!isFinished(live)) {
          emit({ type: 'mismatch', ...id })
          return { kind: 'mismatch' }
        }
        return deps.answerFinished(id, input.fingerprint, live, sent)
      }
      if (Date.now() + pollMs < deadline) {
        await sleep(pollMs)
        pollMs = Math.min(pollMs * 2, 500)
        continue
      }
      const retryAfterMs = held
        ? (live?.lease_remaining_ms ?? LOCK_HELD_RETRY_AFTER_MS)
        : LOCK_HELD_RETRY_AFTER_MS
      emit({ type: 'conflict', retryAfterMs, ...id })
      return { kind: 'in_progress', retryAfterMs, fencedOut: false }
    }
  }

  async function run(
    client: pg.PoolClient,
    input: ExecuteInput,
    id: q.RecordId,
    leaseMs: number,
    retentionMs: number,
    row: lq.LockedLookupRow | undefined,
    sent: Sent,
    storeOnly: { response: StoredResponse; token: string | undefined } | undefined,
  ): Promise<Outcome> {
    // A row that is not expired is an earlier attempt's (released after a retryable failure, or abandoned), or,
    // when storing a permanent error, possibly this attempt's own recovery-point row.
    const earlier = row && !row.expired ? row : undefined
    const own = storeOnly?.token !== undefined && earlier?.lock_token === storeOnly.token
    const attempt = earlier ? earlier.attempts + (own ? 0 : 1) : 1
    if (row?.expired) emit({ type: 'expired', ...id })
    else if (row?.status === 'in_progress' && !own) emit({ type: 'takeover', attempt, ...id })
    if (!storeOnly) emit({ type: 'reserved', attempt, ...id })

    const seen = row ? { version: row.version, status: row.status } : null
    // Created on the first recovery point only: the row it writes carries it, and the finish accepts that row.
    let token = storeOnly?.token
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
    let open = true
    const rollback = async () => {
      open = false
      try {
        await client.query('ROLLBACK')
      } catch (error) {
        broken ??= error as Error
      }
    }

    try {
      let response: StoredResponse
      if (storeOnly) response = storeOnly.response
      else {
        await hooks.afterReserve?.({ ...id, attempt, tx: client })
        const ctx: ExecutionContext = {
          tx: client,
          ...id,
          attempt,
          recoveryPoint: earlier?.recovery_point ?? null,
          saveRecoveryPoint: async (point, tx) => {
            token ??= randomUUID()
            const save = lq.saveRecoveryPoint(names, id, {
              fingerprint: input.fingerprint,
              point,
              token,
              attempt,
              leaseMs,
              retentionMs,
              requestHeaders: input.requestHeaders ?? null,
              seen,
            })
            return (await (tx ?? pool).query(save)).rowCount === 1
          },
          stepKey: (step) => deps.stepKey(id, step),
          get signal() {
            return abort.signal
          },
        }
        try {
          response = normalizeResponse(await input.handler(ctx), config.replayHeaders)
        } catch (error) {
          await rollback()
          const kind = broken ? 'retryable' : (input.classify ?? defaultClassify)(error)
          if (kind === 'retryable') return await released(id, attempt, token, 'error', { error })
          const stored = normalizeResponse(
            (input.renderError ?? defaultRenderError)(error),
            config.replayHeaders,
          )
          // The rollback ended the lock with the handler's writes: take it again to store the error.
          client.off('error', onClientError)
          client.release(broken)
          open = false
          return await executeLocked(input, id, leaseMs, retentionMs, { response: stored, token })
        }
        if (response.status >= 500) {
          await rollback()
          return await released(id, attempt, token, 'server_error_response', { response })
        }
        if (response.body.length > config.maxResponseBytes) {
          await rollback()
          const error = new ResponseTooLargeError(response.body.length, config.maxResponseBytes)
          return await released(id, attempt, token, 'response_too_large', { error })
        }
        await hooks.beforeCommit?.({ ...id, attempt, tx: client })
      }

      const status = storeOnly || response.status >= 400 ? 'failed_permanent' : 'succeeded'
      try {
        await finishOn(client, id, {
          fingerprint: input.fingerprint,
          status,
          response,
          requestHeaders: input.requestHeaders ?? null,
          retentionMs,
          seen,
          attempt,
          // Any uuid that no row carries when no recovery point was saved.
          token: token ?? NO_TOKEN,
        })
        open = false
      } catch (error) {
        if (q.isFenceError(error)) {
          await rollback()
          return await deps.fencedOut(id, attempt)
        }
        // The finish or the COMMIT failed, and the COMMIT may or may not have happened: the client retries and
        // finds out. The connection is dropped, which also ends an open transaction and its lock.
        broken ??= error as Error
        emit({ type: 'store_error', error, ...id })
        return { kind: 'unavailable', retryAfterMs: config.unavailableRetryAfterMs, error }
      }
      // A record that was not expired kept its expiry (measured by the lookup); a new one lives retentionMs from the
      // finish's now(), which is later than `sent`: both bounds are conservative.
      deps.remember(id, input.fingerprint, response, earlier ? earlier.expires_in_ms : retentionMs, sent)
      emit({ type: 'executed', attempt, status: response.status, durationMs: Date.now() - started, ...id })
      await hooks.afterCommit?.({ ...id, attempt })
      return { kind: 'executed', response, status, attempt }
    } catch (error) {
      crashed = error
      abort.abort(error)
      throw error
    } finally {
      if (open && !broken) await rollback()
      if (client.listeners('error').includes(onClientError)) {
        // A broken client, or one abandoned mid-transaction, is destroyed rather than returned to the pool.
        client.release(broken ?? (crashed === undefined ? undefined : new Error('attempt abandoned')))
        client.off('error', onClientError)
      }
    }
  }

  async function released(
    id: q.RecordId,
    attempt: number,
    token: string | undefined,
    reason: 'error' | 'server_error_response' | 'response_too_large',
    detail: { error?: unknown; response?: StoredResponse },
  ): Promise<Outcome> {
    // The rollback ended the lock. A row exists only if this attempt saved a recovery point: release it (fenced on
    // the token) so the next attempt need not wait out its lease.
    if (token !== undefined) {
      try {
        const query = q.release(names, id, token)
        await pool.query(preparedStatements ? query : { text: query.text, values: query.values })
      } catch (error) {
        emit({ type: 'store_error', error, ...id })
      }
    }
    emit({ type: 'released', attempt, reason, ...id })
    return { kind: 'retryable_failure', reason, ...detail }
  }

  return executeLocked
}
