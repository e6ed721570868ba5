import { ATTEMPT_HEADER, IDEMPOTENCY_KEY_HEADER } from '@oncely/protocol'
import pRetry, { AbortError } from 'p-retry'
import { type RetryPolicy, retryDelay } from './backoff.js'
import { isRetryableAnswer, PACED_MIN_MS } from './classify.js'
import { diagnoseNetworkError, hiddenHeaderError } from './cors.js'
import type { Emitter } from './emitter.js'
import { type HTTPError, isHTTPError } from './errors/http-error.js'
import { IntentExpiredError } from './errors/intent-expired-error.js'
import { isNetworkError } from './errors/network-error.js'
import { RetryExhaustedError } from './errors/retry-exhausted-error.js'
import type { ClientEvents } from './events.js'
import type { IntentRecord, RecordedResponse } from './intent.js'
import { httpErrorFor, isReplayed, type OncelyResponse, parseData, recordedResponse } from './response.js'
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
 * Runs one intent to an outcome in the single retry loop (p-retry around one `fetch` per attempt). p-retry counts attempts;
 * the waits are computed here (Retry-After, full jitter) and slept with the injectable timers, because p-retry's
 * own delay cannot express Retry-After. Every attempt is recorded in the store before it is sent (the first one
 * of a fresh intent by its write-ahead record, see {@link DriveOptions.counted}).
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
  let record = initial
  let counted = options.counted === true
  const save = async (patch: Partial<IntentRecord>): Promise<void> => {
    const next = { ...record, ...patch, version: record.version + 1 }
    // Not flushed: if a power loss loses it, the durable write-ahead record is resent with the same key and replayed.
    await ctx.store.set(next, { durable: false })
    record = next
  }
  const started = ctx.timers.now()
  const errors: Error[] = []
  let lastResponse: RawResponse | undefined
  // p-retry rethrows an AbortError's message wrapper; the real reason to stop travels here.
  let stop: { error: unknown } | undefined
  // Set once a look at a failed cross-origin attempt found its headers allowed by CORS: no need to look again.
  let preflightAllowed = false
  const halt = (error: unknown): never => {
    stop = { error }
    throw new AbortError('stop')
  }

  try {
    const attempt = async (): Promise<RawResponse> => {
      if (ctx.timers.now() >= record.expiresAt) halt(await expire(ctx, record, save))
      if (counted) counted = false
      else await save({ attempts: record.attempts + 1 })
      ctx.events.emit('attempt', {
        id: record.id,
        key: record.key,
        attempt: record.attempts,
        method: record.method,
        url: record.url,
      })
      const headers = {
        ...record.headers,
        ...transient,
        ...(ctx.headers ? await ctx.headers() : {}),
        [IDEMPOTENCY_KEY_HEADER]: record.key,
        [ATTEMPT_HEADER]: String(record.attempts),
      }
      const response = await sendAttempt(record, headers, {
        fetch: ctx.fetch,
        timeoutMs: ctx.timeoutMs,
        signal,
        timers: ctx.timers,
      }).catch(async (error: unknown) => {
        // A browser reports a CORS refusal as a network error: look closer before retrying it (see cors.ts).
        if (isNetworkError(error) && !preflightAllowed) {
          const found = await diagnoseNetworkError(record, headers, error, ctx)
          if (found === 'allowed') preflightAllowed = true
          else if (found) halt(found)
        }
        throw error
      })
      if (response.status < 400) return response
      lastResponse = response
      const error = httpErrorFor(response.status, response.headers, response.text)
      const hidden = hiddenHeaderError(record, response, error.problem)
      if (hidden) halt(hidden)
      if (!isRetryableAnswer(response.status, isReplayed(response.headers), error.problem)) return halt(error)
      throw error
    }
    // Whether the retry being scheduled waits a Retry-After the server asked for: such a retry is paced by the
    // server and does not count against retry.limit (p-retry's retriesConsumed counts only the others), while
    // retry.maxElapsedMs bounds every wait. So a duplicate of a long request keeps asking while the server says it
    // is in flight, and a client's own backoff still stops after retry.limit.
    let paced = false
    const raw = await pRetry(
      // Only a network error or a retryable status is retried; anything else (the store failing, the `headers`
      // option throwing, an abort, a final status) ends the run.
      () =>
        attempt().catch((error: unknown) => {
          if (error instanceof AbortError || isNetworkError(error) || isHTTPError(error)) throw error
          return halt(error)
        }),
      {
        // Counted here instead (see `paced`): p-retry refuses any retry, consumed or not, once `retries` is spent.
        retries: Number.POSITIVE_INFINITY,
        minTimeout: 0,
        maxTimeout: 0,
        ...(signal ? { signal } : {}),
        shouldConsumeRetry: () => !paced,
        onFailedAttempt: async ({ error, retriesConsumed }) => {
          errors.push(error)
          await save({ lastError: summarize(error) })
          const exhausted = (reason: string) =>
            new RetryExhaustedError({ intentId: record.id, key: record.key, errors, reason })
          const now = ctx.timers.now()
          const wait = retryDelay(
            ctx.retry,
            retriesConsumed,
            ctx.random,
            now,
            isHTTPError(error) ? lastResponse : undefined,
          )
          paced = wait.retryAfter && wait.delayMs >= PACED_MIN_MS
          if (!paced && retriesConsumed >= ctx.retry.limit) {
            throw exhausted(`retry.limit of ${ctx.retry.limit} reached`)
          }
          if (now - started + wait.delayMs > ctx.retry.maxElapsedMs) {
            throw exhausted(`retry.maxElapsedMs of ${ctx.retry.maxElapsedMs} ms reached`)
          }
          ctx.events.emit('retry', {
            id: record.id,
            key: record.key,
            attempt: record.attempts,
            delayMs: wait.delayMs,
            retryAfter: wait.retryAfter,
            reason: isHTTPError(error)
              ? `status ${error.status}`
              : error.name === 'NetworkError'
                ? 'network'
                : error.name,
            error,
          })
          await sleep(ctx.timers, wait.delayMs, signal)
        },
      },
    )
    return await settle(ctx, record, save, raw)
  } catch (thrown) {
    const error = stop ? stop.error : thrown
    if (signal?.aborted && error === signal.reason) throw error // aborted: the intent stays pending
    if (error instanceof IntentExpiredError) throw error
    if (error instanceof RetryExhaustedError) {
      ctx.events.emit('failed', { id: record.id, key: record.key, error, pending: true })
      throw error
    }
    if (isHTTPError(error) && lastResponse) {
      // A final answer: resending cannot help.
      await fail(ctx, record, save, error, lastResponse)
    } else {
      // The store, the `headers` option or the runtime failed: keep the intent, so no acknowledged work is lost.
      ctx.events.emit('failed', { id: record.id, key: record.key, error: asError(error), pending: true })
    }
    throw error
  }
}

async function settle(
  ctx: DriveContext,
  record: IntentRecord,
  save: (patch: Partial<IntentRecord>) => Promise<void>,
  raw: RawResponse,
): Promise<OncelyResponse> {
  const replayed = isReplayed(raw.headers)
  const response: OncelyResponse = {
    status: raw.status,
    headers: raw.headers,
    data: parseData(raw.text, raw.headers),
    key: record.key,
    intentId: record.id,
    replayed,
    source: replayed ? 'replay' : 'network',
    attempts: record.attempts,
  }
  await finish(ctx, record, save, 'settled', recordedResponse(raw.status, raw.headers, raw.text))
  ctx.events.emit('settled', {
    id: record.id,
    key: record.key,
    status: raw.status,
    replayed,
    source: response.source as 'network' | 'replay',
    attempts: record.attempts,
  })
  return response
}

async function fail(
  ctx: DriveContext,
  record: IntentRecord,
  save: (patch: Partial<IntentRecord>) => Promise<void>,
  error: HTTPError,
  raw: RawResponse,
): Promise<void> {
  const outcome = recordedResponse(raw.status, raw.headers, raw.text)
  await finish(ctx, record, save, 'failed', outcome, summarize(error))
  ctx.events.emit('failed', { id: record.id, key: record.key, error, pending: false })
}

// One-off intents (id === key) cannot be asked for again, so they are deleted; named intents keep their outcome
// for settledTtlMs so a repeated call with the same intentId gets it without sending. Either write is done before
// the answer is given, so once a caller has its answer no crash of this process brings the intent back; neither
// is flushed, so a power loss may (resume() then resends it with the same key and bytes, and the server replays).
async function finish(
  ctx: DriveContext,
  record: IntentRecord,
  save: (patch: Partial<IntentRecord>) => Promise<void>,
  state: 'settled' | 'failed',
  outcome: RecordedResponse,
  lastError?: IntentRecord['lastError'],
): Promise<void> {
  try {
    if (record.id === record.key || ctx.settledTtlMs === 0) {
      await ctx.store.delete(record.id, { durable: false })
      return
    }
    await save({
      state,
      outcome,
      keepUntil: ctx.timers.now() + ctx.settledTtlMs,
      ...(lastError ? { lastError } : {}),
    })
  } catch {
    // The answer stands: the server gave it. The intent stays pending in the store, and resume() resends it with
    // the same key and bytes for the server to replay.
  }
}

/** Marks the intent expired (kept for reconciliation) and returns the error to throw. */
export async function expire(
  ctx: Pick<DriveContext, 'events'>,
  record: IntentRecord,
  save: (patch: Partial<IntentRecord>) => Promise<void>,
): Promise<IntentExpiredError> {
  const error = new IntentExpiredError({ intentId: record.id, key: record.key, expiresAt: record.expiresAt })
  if (record.state !== 'expired') {
    await save({ state: 'expired', lastError: summarize(error) })
    ctx.events.emit('expired', {
      id: record.id,
      key: record.key,
      createdAt: record.createdAt,
      expiresAt: record.expiresAt,
    })
  }
  return error
}

function summarize(error: unknown): NonNullable<IntentRecord['lastError']> {
  const e = asError(error)
  return { name: e.name, message: e.message, ...(isHTTPError(e) ? { status: e.status } : {}) }
}

function asError(error: unknown): Error {
  return error instanceof Error ? error : new Error(String(error))
}
