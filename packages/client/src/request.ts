import { encodeBody, type RequestBody } from './body.js'
import { drive } from './drive.js'
import { type Driven, type Driver, outcomeOf, reusedLocally, sameRequest } from './driver.js'
import { isHTTPError } from './errors/http-error.js'
import { isIdempotencyKeyReusedError } from './errors/idempotency-key-reused-error.js'
import { StorageError } from './errors/storage-error.js'
import type { IntentRecord } from './intent.js'
import { deriveKey, randomKey } from './keys.js'
import type { ResolvedOptions } from './options.js'
import { isReplayed, type OncelyResponse } from './response.js'
import { sleep } from './timers.js'

/** One call of `client.request`. */
export interface RequestOptions {
  /**
   * HTTP method.
   * @default 'POST'
   * @example 'PUT'
   */
  method?: string
  /**
   * Path (or absolute URL) resolved against `baseUrl`. Required.
   * @default none: required
   * @example '/v1/payments'
   */
  path: string
  /**
   * Query parameters appended to the URL.
   * @default none
   * @example { expand: 'customer' }
   */
  searchParams?: Record<string, string> | URLSearchParams
  /**
   * A JSON body (sent as `application/json`).
   * @default none
   * @example { amount: 100, currency: 'eur' }
   */
  json?: unknown
  /**
   * A raw body: string, URLSearchParams, ArrayBuffer, typed array, or FormData without files.
   * @default none
   * @example new URLSearchParams({ amount: '100' })
   */
  body?: RequestBody
  /**
   * Headers of this request. Persisted with the intent, except `authorization`, `cookie` and
   * `proxy-authorization`, which are used for this call only (give credentials to `createClient({ headers })`).
   * @default none
   * @example { 'x-request-source': 'checkout' }
   */
  headers?: Record<string, string>
  /**
   * A business fact naming the intent, such as `checkout:cart_42`. The key is derived from it and the target, so
   * the same fact always gives the same key; a second call while it is pending joins it, and after it settled
   * returns the recorded outcome (for `settledTtlMs`, with `source: 'store'`).
   * @default none: a one-off intent with a random key
   * @example 'checkout:cart_42'
   */
  intentId?: string
  /**
   * A new try after a final error. When the intent named by `intentId` ended with a final error status (a 4xx such
   * as a declined card, recorded in the local store or replayed by the server), this call starts a new try of the
   * intent under a new key, with this call's body (which may differ: another card), instead of answering that
   * error again. While a try is in flight the call joins it, and after a success it gets that success, as
   * without this option. The keys of successive tries are derived from `intentId` too (try n has its own), so
   * every tab and device walks the same sequence: a try that succeeded anywhere is replayed, never run twice.
   * Ignored without `intentId`.
   * @default false: the same `intentId` answers its final error again (from the store, then the server's replay)
   * @example retryFailed: true
   */
  retryFailed?: boolean
  /**
   * Called with the intent's id and key as soon as they are minted, before anything is written or sent, so the
   * caller can follow this intent's events (`attempt`, `retry`, ...) by `id`, even for a one-off intent whose key is
   * random. Called again with the new key if the call drives another try of a named intent (see `retryFailed`).
   * @default none
   * @example onIntent: ({ id, key }) => console.log(`paying as ${key}`)
   */
  onIntent?: (intent: { id: string; key: string }) => void
  /**
   * Cancels the waits and the request in flight; the intent stays pending (see `client.discard`).
   * @default none
   * @example AbortSignal.timeout(10_000)
   */
  signal?: AbortSignal
}

const SECRET_HEADERS = new Set(['authorization', 'cookie', 'proxy-authorization'])

/**
 * Sends one mutation: writes its intent before the first byte, drives it to an outcome, or answers from the store
 * when the same `intentId` settled within `settledTtlMs`.
 */
export async function request(
  driver: Driver,
  resolved: ResolvedOptions,
  req: RequestOptions,
): Promise<OncelyResponse> {
  if (typeof req?.path !== 'string') throw new TypeError('Expected `path` to be a string')
  if (req.retryFailed !== undefined && typeof req.retryFailed !== 'boolean') {
    throw new TypeError(`Expected \`retryFailed\` to be a boolean, got ${String(req.retryFailed)}`)
  }
  req.signal?.throwIfAborted() // cancelled before it began: record nothing
  const { record, transient } = await intentOf(req, resolved, driver.ctx.timers.now())
  let reported: string | undefined
  const report = (driven: IntentRecord) => {
    if (driven.key === reported) return
    reported = driven.key
    req.onIntent?.({ id: driven.id, key: driven.key })
  }
  report(record)
  const run =
    req.intentId === undefined
      ? () => createAndDrive(driver, record, transient, req.signal)
      : () =>
          driveNamed(driver, record, transient, req.signal, {
            retryFailed: req.retryFailed === true,
            ttlMs: resolved.intentTtlMs,
            report,
          })
  for (;;) {
    const result = await driver.track(record.id, record, run)
    if (!('skipped' in result)) return result
    // We joined a resume() that another tab pre-empted; now drive (or wait for) it ourselves.
  }
}

// The write-ahead record of a call (it already counts the first attempt, so it is the only write before the first
// byte), and the headers of this call that are never stored.
async function intentOf(
  req: RequestOptions,
  resolved: ResolvedOptions,
  now: number,
): Promise<{ record: IntentRecord; transient: Record<string, string> }> {
  const method = (req.method ?? 'POST').toUpperCase()
  const url = new URL(req.path, resolved.baseUrl)
  if (req.searchParams) {
    for (const [name, value] of new URLSearchParams(req.searchParams)) url.searchParams.append(name, value)
  }
  const encoded = await encodeBody(req.json, req.body)
  const persisted: Record<string, string> = {}
  const transient: Record<string, string> = {}
  if (encoded.contentType) persisted['content-type'] = encoded.contentType
  for (const [name, value] of Object.entries(req.headers ?? {})) {
    const lower = name.toLowerCase()
    if (SECRET_HEADERS.has(lower)) transient[lower] = value
    else persisted[lower] = value
  }
  const key = req.intentId === undefined ? randomKey() : deriveKey(req.intentId, method, url.href)
  const record: IntentRecord = {
    format: 1,
    id: req.intentId ?? key,
    key,
    method,
    url: url.href,
    ...(encoded.body ? { body: encoded.body } : {}),
    headers: persisted,
    createdAt: now,
    expiresAt: now + resolved.intentTtlMs,
    attempts: 1, // counts the first attempt, sent once this record is written
    version: 1,
    state: 'pending',
  }
  return { record, transient }
}

// A one-off intent has a fresh random key: nobody else can know its id before it is written. A store with
// `create` writes it and makes this client its owner in one write; otherwise the claim is requested together with
// the write-ahead write and nothing needs re-reading under it.
async function createAndDrive(
  driver: Driver,
  record: IntentRecord,
  transient: Record<string, string>,
  signal: AbortSignal | undefined,
): Promise<Driven> {
  const section = () => drive(driver.ctx, record, transient, signal, { counted: true })
  const created = driver.create(record, section)
  if (created) return created
  const written = driver.ctx.store.set(record) // write-ahead: nothing is sent before this resolves
  written.catch(() => {}) // observed below; only keeps a failed write from being reported as unhandled
  const result = await driver.exclusive(record.id, async () => {
    await written
    return section()
  })
  if (result.acquired) return result.value
  await written
  // Another process or tab (its resume()) claimed it first: wait for it, then take what it left.
  const stored = await driver.driveStored(record.id, transient, signal, true)
  if ('skipped' in stored)
    throw new StorageError(`Intent ${record.id} vanished from the store before it was sent`)
  return stored
}

/** How {@link driveNamed} treats the tries of a named intent. */
interface NamedOptions {
  /** Start a new try after a try that ended with a final error (see `RequestOptions.retryFailed`). */
  retryFailed: boolean
  /** The intent's `intentTtlMs`, for a new try's record. */
  ttlMs: number
  /** Tells the caller which record (which try's key) this call drives. */
  report: (record: IntentRecord) => void
}

/**
 * Most tries one call walks through, each answered with a replayed final error, before it answers the last one: a
 * server that replays an error for every key must not make one call mint keys forever.
 */
const MAX_TRIES_PER_CALL = 16

// A named intent may already exist, here or in another tab: read it under the claim, then either return its
// recorded outcome, drive it, or write this one ahead and drive it (no re-read needed: the claim is already held).
// With `retryFailed`, a try that ended with a final error (recorded, or replayed by the server) is followed by the
// next try, under the next derived key.
async function driveNamed(
  driver: Driver,
  record: IntentRecord,
  transient: Record<string, string>,
  signal: AbortSignal | undefined,
  options: NamedOptions,
): Promise<Driven> {
  const { ctx } = driver
  // Writes try `number` of the intent (this call's bytes) ahead, replacing the record of the try before it.
  const writeTry = async (number: number, replaced: IntentRecord): Promise<IntentRecord> => {
    const now = ctx.timers.now()
    const next: IntentRecord = {
      ...record,
      key: deriveKey(record.id, record.method, record.url, number),
      try: number,
      createdAt: now,
      expiresAt: now + options.ttlMs,
      version: replaced.version + 1,
    }
    await ctx.store.set(next) // write-ahead: nothing is sent before this resolves
    return next
  }
  // Drives `current` and, with retryFailed, each next try while the server replays a final error for the key.
  const walk = async (current: IntentRecord, counted: boolean): Promise<OncelyResponse> => {
    for (let walked = 1; ; walked++) {
      options.report(current)
      try {
        return await drive(ctx, current, transient, signal, { counted })
      } catch (error) {
        const replayedFailure =
          isHTTPError(error) && !isIdempotencyKeyReusedError(error) && isReplayed(error.headers)
        if (!options.retryFailed || !replayedFailure || walked >= MAX_TRIES_PER_CALL) throw error
        current = await writeTry((current.try ?? 0) + 1, (await ctx.store.get(current.id)) ?? current)
        counted = true
      }
    }
  }
  for (;;) {
    const result = await driver.exclusive(record.id, async (): Promise<Driven> => {
      const existing = await ctx.store.get(record.id)
      const live =
        existing &&
        (existing.state === 'pending' ||
          existing.state === 'expired' ||
          (existing.keepUntil ?? 0) > record.createdAt)
      if (existing && live) {
        // Not after a 422: that key was used with other bytes, whose outcome (perhaps a success) is unknown here.
        if (existing.state === 'failed' && options.retryFailed && existing.outcome?.status !== 422) {
          return walk(await writeTry((existing.try ?? 0) + 1, existing), true)
        }
        if (!sameRequest(existing, record)) throw reusedLocally(existing)
        if (existing.state !== 'pending') return outcomeOf(existing)
        return walk(existing, false)
      }
      // Absent, or settled and forgotten: a fresh record derives the same key as the last try known here, so the
      // server answers with its stored response.
      if (existing?.try) return walk(await writeTry(existing.try, existing), true)
      await ctx.store.set(record) // write-ahead: nothing is sent before this resolves
      return walk(record, true)
    })
    if (result.acquired) return result.value
    await sleep(ctx.timers, 250, signal) // another tab or process drives it: wait for its outcome
  }
}
