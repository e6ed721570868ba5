import type { DriveContext } from './drive.js'
import type { HTTPError } from './errors/http-error.js'
import { isHTTPError } from './errors/http-error.js'
import { IntentExpiredError } from './errors/intent-expired-error.js'
import type { IntentRecord, RecordedResponse } from './intent.js'
import { isReplayed, type OncelyResponse, parseData, recordedResponse } from './response.js'
import type { RawResponse } from './send.js'

/** A run of an intent as its outcome is written: its client, its record as last saved, and how to save the next. */
export interface RunRecord {
  readonly ctx: DriveContext
  readonly record: IntentRecord
  save(patch: Partial<IntentRecord>): Promise<void>
}

/** Settles the intent with a success (or a replay) and returns the caller's response. */
export async function settle(run: RunRecord, raw: RawResponse): Promise<OncelyResponse> {
  const { ctx, record } = run
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
  await finish(run, 'settled', recordedResponse(raw.status, raw.headers, raw.text))
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

/** Settles the intent as failed with a final error status. */
export async function fail(run: RunRecord, error: HTTPError, raw: RawResponse): Promise<void> {
  const { ctx, record } = run
  await finish(run, 'failed', recordedResponse(raw.status, raw.headers, raw.text), summarize(error))
  ctx.events.emit('failed', { id: record.id, key: record.key, error, pending: false })
}

// One-off intents (id === key) cannot be asked for again, so they are deleted; named intents keep their outcome
// for settledTtlMs so a repeated call with the same intentId gets it without sending. Either write is done before
// the answer is given, so once a caller has its answer no crash of this process brings the intent back; neither
// is flushed, so a power loss may (resume() then resends it with the same key and bytes, and the server replays).
async function finish(
  run: RunRecord,
  state: 'settled' | 'failed',
  outcome: RecordedResponse,
  lastError?: IntentRecord['lastError'],
): Promise<void> {
  const { ctx, record } = run
  try {
    if (record.id === record.key || ctx.settledTtlMs === 0) {
      await ctx.store.delete(record.id, { durable: false })
      return
    }
    await run.save({
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
export async function expire(run: RunRecord): Promise<IntentExpiredError> {
  const { ctx, record } = run
  const error = new IntentExpiredError({ intentId: record.id, key: record.key, expiresAt: record.expiresAt })
  if (record.state !== 'expired') {
    await run.save({ state: 'expired', lastError: summarize(error) })
    ctx.events.emit('expired', {
      id: record.id,
      key: record.key,
      createdAt: record.createdAt,
      expiresAt: record.expiresAt,
    })
  }
  return error
}

/** What the store keeps of the last error of an intent. */
export function summarize(error: unknown): NonNullable<IntentRecord['lastError']> {
  const e = asError(error)
  return { name: e.name, message: e.message, ...(isHTTPError(e) ? { status: e.status } : {}) }
}

/** `error`, or an `Error` saying what was thrown instead of one. */
export function asError(error: unknown): Error {
  return error instanceof Error ? error : new Error(String(error))
}
