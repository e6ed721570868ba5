import { ATTEMPT_HEADER, IDEMPOTENCY_KEY_HEADER } from '@oncely/protocol'
import { diagnoseNetworkError, hiddenHeaderError } from './cors.js'
import type { Emitter } from './emitter.js'
import { type HTTPError, isHTTPError } from './errors/http-error.js'
import { IntentExpiredError } from './errors/intent-expired-error.js'
import { isNetworkError } from './errors/network-error.js'
import { RetryExhaustedError } from './errors/retry-exhausted-error.js'
import type { ClientEvents } from './events.js'
import type { IntentRecord } from './intent.js'
import { nextDelay, type RetryPolicy } from './next-delay.js'
import { httpErrorFor, type OncelyResponse } from './response.js'
import { asError, expire, fail, type RunRecord, settle, summarize } from './run-outcome.js'
import { type RawResponse, sendAttempt } from './send.js'
import type { IntentStore } from './store.js'
import { sleep, type Timers } from './timers.js'
/** What one run of an intent needs from its client. */
export interface DriveContext {
  store: IntentStore
  events: Emitter<ClientEvents>
  timers: Timers
  random: () => number
  retry: RetryPolicy
  timeoutMs: number | false
  settledTtlMs: number
  fetch: typeof fetch | undefined
  headers: (() => Record<string, string> | Promise<Record<string, string>>) | undefined
}

/** How {@link drive} runs one intent. */
export interface DriveOptions {
  /**
   * True when `initial` was just written as the write-ahead record with its first attempt already counted, so
   * that attempt is sent without another write (one store write before the first byte, not two).
   */
  counted?: boolean
}

/**
 * Runs one intent to an outcome in the single retry loop: one `fetch` per attempt, and after each failed attempt
 * the wait {@link nextDelay} decides (Retry-After, full jitter, the budgets), slept with the injectable timers.
 * Every attempt is recorded in the store before it is sent (the first one of a fresh intent by its write-ahead
 * record, see {@link DriveOptions.counted}).
 *
 * `transient` holds headers of this call that are never persisted (credentials passed per request).
 */
export async function drive(
  ctx: DriveContext,
  initial: IntentRecord,
  transient: Record<string, string>,
  signal: AbortSignal | undefined,
  options: DriveOptions = {},
): Promise<OncelyResponse> {
  const run = new Run(ctx, initial, transient, signal, options.counted === true)
  let answer: Answer
  try {
    answer = await run.loop()
  } catch (error) {
    run.stopped(error)
    throw error
  }
  if (answer.final) {
    // A final answer: resending cannot help.
    await fail(run, answer.final, answer.response)
    throw answer.final
  }
  try {
    return await settle(run, answer.response)
  } catch (error) {
    run.stopped(error)
    throw error
  }
}

/** How an attempt ended: an answer (a success, or a `final` error status), or a failure worth a retry decision. */
type Attempted = { answer: Answer } | { failure: unknown; response?: RawResponse }

/** An answer the run ends with: a success, or an error status that resending cannot change (`final`). */
interface Answer {
  response: RawResponse
  final?: HTTPError
}

// One run of an intent: its record as last saved, and what its attempts learned.
class Run implements RunRecord {
  record: IntentRecord
  readonly #errors: Error[] = []
  #counted: boolean
  // Set once a look at a failed cross-origin attempt found its headers allowed by CORS: no need to look again.
  #preflightAllowed = false

  constructor(
    readonly ctx: DriveContext,
    initial: IntentRecord,
    readonly transient: Record<string, string>,
    readonly signal: AbortSignal | undefined,
    counted: boolean,
  ) {
    this.record = initial
    this.#counted = counted
  }

  readonly save = async (patch: Partial<IntentRecord>): Promise<void> => {
    const next = { ...this.record, ...patch, version: this.record.version + 1 }
    // Not flushed: if a power loss loses it, the durable write-ahead record is resent with the same key and replayed.
    await this.ctx.store.set(next, { durable: false })
    this.record = next
  }

  /**
   * Attempts until an answer, waiting what {@link nextDelay} says between attempts. Rejects with the reason to
   * stop: the signal's reason, `IntentExpiredError`, `RetryExhaustedError`, a `CorsError`, or whatever failed
   * outside the attempt itself (the store, the `headers` option, the runtime).
   */
  async loop(): Promise<Answer> {
    const { ctx, signal } = this
    const startedAt = ctx.timers.now()
    let counted = 0
    for (;;) {
      signal?.throwIfAborted()
      const attempted = await this.#attempt()
      if ('answer' in attempted) {
        signal?.throwIfAborted()
        return attempted.answer
      }
      const { failure, response } = attempted
      const state = { counted, startedAt, now: ctx.timers.now(), random: ctx.random }
      const next = nextDelay(ctx.retry, state, failure, response)
      if (!next.retry && !next.exhausted) {
        if (isHTTPError(failure) && response) return { response, final: failure }
        throw failure
      }
      this.#errors.push(failure as Error)
      await this.save({ lastError: summarize(failure) })
      if (!next.retry) {
        const { id, key } = this.record
        throw new RetryExhaustedError({ intentId: id, key, errors: this.#errors, reason: next.exhausted! })
      }
      if (next.counted) counted++
      this.#emitRetry(failure as Error, next.delayMs, next.retryAfter)
      await sleep(ctx.timers, next.delayMs, signal)
    }
  }

  /** Reports a run that ended without an answer. */
  stopped(error: unknown): void {
    const { ctx, record, signal } = this
    if (signal?.aborted && error === signal.reason) return // aborted: the intent stays pending
    if (error instanceof IntentExpiredError) return
    // Exhausted, or the store, the `headers` option or the runtime failed: keep the intent, so no acknowledged work
    // is lost.
    ctx.events.emit('failed', { id: record.id, key: record.key, error: asError(error), pending: true })
  }

  // One attempt: counted in the store, then sent. A stop (expiry, a CORS refusal) rejects.
  async #attempt(): Promise<Attempted> {
    const { ctx } = this
    if (ctx.timers.now() >= this.record.expiresAt) throw await expire(this)
    if (this.#counted) this.#counted = false
    else await this.save({ attempts: this.record.attempts + 1 })
    const record = this.record
    ctx.events.emit('attempt', {
      id: record.id,
      key: record.key,
      attempt: record.attempts,
      method: record.method,
      url: record.url,
    })
    const headers = {
      ...record.headers,
      ...this.transient,
      ...(ctx.headers ? await ctx.headers() : {}),
      [IDEMPOTENCY_KEY_HEADER]: record.key,
      [ATTEMPT_HEADER]: String(record.attempts),
    }
    let response: RawResponse
    try {
      response = await sendAttempt(record, headers, {
        fetch: ctx.fetch,
        timeoutMs: ctx.timeoutMs,
        signal: this.signal,
        timers: ctx.timers,
      })
    } catch (error) {
      // A browser reports a CORS refusal as a network error: look closer before retrying it (see cors.ts).
      if (isNetworkError(error) && !this.#preflightAllowed) {
        const found = await diagnoseNetworkError(record, headers, error, ctx)
        if (found === 'allowed') this.#preflightAllowed = true
        else if (found) throw found
      }
      if (isNetworkError(error)) return { failure: error }
      throw error
    }
    if (response.status < 400) return { answer: { response } }
    const error = httpErrorFor(response.status, response.headers, response.text)
    const hidden = hiddenHeaderError(record, response, error.problem)
    if (hidden) throw hidden
    return { failure: error, response }
  }

  #emitRetry(error: Error, delayMs: number, retryAfter: boolean): void {
    this.ctx.events.emit('retry', {
      id: this.record.id,
      key: this.record.key,
      attempt: this.record.attempts,
      delayMs,
      retryAfter,
      reason: isHTTPError(error)
        ? `status ${error.status}`
        : error.name === 'NetworkError'
          ? 'network'
          : error.name,
      error,
    })
  }
}
