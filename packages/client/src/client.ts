import { encodeBody, type RequestBody } from './body.js'
import { watchConnectivity } from './browser.js'
import { type DriveContext, drive } from './drive.js'
import { Emitter } from './emitter.js'
import { IdempotencyKeyReusedError } from './errors/idempotency-key-reused-error.js'
import { IntentExpiredError } from './errors/intent-expired-error.js'
import { OncelyError } from './errors/oncely-error.js'
import { StorageError } from './errors/storage-error.js'
import type { ClientEvents } from './events.js'
import type { IntentRecord, PendingIntent } from './intent.js'
import { deriveKey, randomKey } from './keys.js'
import { type ClientOptions, resolveOptions } from './options.js'
import { mapLimit } from './pool.js'
import { httpErrorFor, type OncelyResponse, parseData } from './response.js'
import type { ExclusiveResult, IntentStore } from './store.js'
import { defaultStore } from './stores/default.js'
import { defaultTimers, sleep } from './timers.js'

/** One call of `client.request`. */
export interface RequestOptions {
  /** HTTP method. @default 'POST' */
  method?: string
  /** Path (or absolute URL) resolved against `baseUrl`. @example '/v1/payments' */
  path: string
  /** Query parameters appended to the URL. */
  searchParams?: Record<string, string> | URLSearchParams
  /** A JSON body (sent as `application/json`). */
  json?: unknown
  /** A raw body: string, URLSearchParams, ArrayBuffer, typed array, or FormData without files. */
  body?: RequestBody
  /**
   * Headers of this request. Persisted with the intent, except `authorization`, `cookie` and
   * `proxy-authorization`, which are used for this call only (give credentials to `createClient({ headers })`).
   */
  headers?: Record<string, string>
  /**
   * A business fact naming the intent, such as `checkout:cart_42`. The key is derived from it and the target, so
   * the same fact always gives the same key; a second call while it is pending joins it, and after it settled
   * returns the stored outcome (for `settledTtlMs`).
   */
  intentId?: string
  /** Cancels the waits and the request in flight; the intent stays pending (see `client.discard`). */
  signal?: AbortSignal
  /**
   * Called once with the intent's id and key as soon as they are minted, before anything is written or sent, so the
   * caller can follow this intent's events (`attempt`, `retry`, ...) by `id`, even for a one-off intent whose key is
   * random.
   * @example onIntent: ({ id, key }) => console.log(`paying as ${key}`)
   */
  onIntent?: (intent: { id: string; key: string }) => void
}

/** One intent's result from `client.resume()`. */
export type ResumeOutcome =
  | { id: string; key: string; outcome: 'settled'; response: OncelyResponse }
  | { id: string; key: string; outcome: 'failed'; error: unknown }
  | { id: string; key: string; outcome: 'skipped'; reason: 'busy' | 'not-pending' }

/** The oncely client: see {@link createClient}. */
export interface OncelyClient {
  /** Sends a mutation with an idempotency key, writing the intent before the first byte and retrying safely. */
  request<T = unknown>(options: RequestOptions): Promise<OncelyResponse<T>>
  /** A reusable function for one endpoint: `(json, options?) => client.request(...)`. */
  mutation<TBody = unknown, T = unknown>(
    definition: Omit<RequestOptions, 'json' | 'body' | 'intentId' | 'signal' | 'onIntent'>,
  ): (
    json: TBody,
    options?: Pick<RequestOptions, 'intentId' | 'signal' | 'headers' | 'onIntent'>,
  ) => Promise<OncelyResponse<T>>
  /** Intents not confirmed yet (pending, or expired with an unknown outcome). */
  pending(): Promise<PendingIntent[]>
  /**
   * Re-drives every pending intent with its original key and bytes, oldest first and at most `resumeConcurrency`
   * at a time; returns each outcome. An intent that fails does not stop the others.
   */
  resume(): Promise<ResumeOutcome[]>
  /** Forgets an intent (for example after reconciling an expired one). */
  discard(id: string): Promise<void>
  /** Subscribes to an event; returns the unsubscribe function. */
  on<E extends keyof ClientEvents>(event: E, listener: (payload: ClientEvents[E]) => void): () => void
  /** Removes browser listeners and closes the store. Pending intents stay in the store. */
  close(): Promise<void>
}

const SECRET_HEADERS = new Set(['authorization', 'cookie', 'proxy-authorization'])

// A run's result: the response, or why this tab did not drive the intent.
type Driven = OncelyResponse | { skipped: 'busy' | 'not-pending' }

/**
 * Creates a client. Nothing touches the network, storage or browser globals until it is used.
 *
 * @example
 * const client = createClient({
 *   baseUrl: 'https://api.example.com',
 *   headers: async () => ({ authorization: `Bearer ${await getToken()}` }),
 * })
 * const res = await client.request({ path: '/v1/payments', json: { amount: 100 }, intentId: 'checkout:cart_42' })
 */
export function createClient(options: ClientOptions): OncelyClient {
  const resolved = resolveOptions(options)
  const events = new Emitter<ClientEvents>()
  const timers = options.timers ?? defaultTimers
  const store: IntentStore = options.store ?? defaultStore()
  store.attach?.((event, payload) => events.emit(event, payload as ClientEvents[typeof event]))
  const ctx: DriveContext = {
    store,
    events,
    timers,
    random: options.random ?? Math.random,
    retry: resolved.retry,
    timeoutMs: resolved.timeoutMs,
    settledTtlMs: resolved.settledTtlMs,
    fetch: options.fetch,
    headers: options.headers,
  }
  // Runs of this process, by intent id: a second call for the same intent joins the first.
  const inflight = new Map<string, { request: IntentRecord | undefined; promise: Promise<Driven> }>()

  const track = (id: string, request: IntentRecord | undefined, run: () => Promise<Driven>) => {
    const existing = inflight.get(id)
    if (existing) {
      if (request && existing.request && !sameRequest(existing.request, request)) {
        return Promise.reject(reusedLocally(existing.request))
      }
      return existing.promise
    }
    const promise = run().finally(() => inflight.delete(id))
    inflight.set(id, { request, promise })
    return promise
  }

  // Store work left after an answer (the delete of a settled one-off intent, the release of its claim). Its
  // failures are ignored: the record then stays pending and resume() resends it with the same key and bytes.
  const background = new Set<Promise<unknown>>()
  const inBackground = (work: Promise<unknown>) => {
    const tracked: Promise<unknown> = work.catch(() => {}).finally(() => background.delete(tracked))
    background.add(tracked)
  }
  // This process's answered intents are no longer pending once their deferred work is done; list after it.
  const drained = async () => {
    while (background.size > 0) await Promise.all(background)
  }

  // Runs `fn` under the store's cross-tab claim on `id` (directly when the store has none) and answers as soon as
  // `fn` does: the work `fn` deferred, then the release of the claim, finish in the background, still in order.
  const claimed = <T>(
    id: string,
    fn: (defer: (work: Promise<unknown>) => void) => Promise<T>,
  ): Promise<ExclusiveResult<T>> =>
    new Promise((resolve, reject) => {
      let answered = false
      let held: Promise<unknown> | undefined
      const inner = async () => {
        const deferred: Promise<unknown>[] = []
        try {
          const value = await fn((work) => deferred.push(work.catch(() => {})))
          resolve({ acquired: true, value })
        } catch (error) {
          reject(error)
        }
        answered = true
        if (held) inBackground(held)
        await Promise.all(deferred)
      }
      held = (store.exclusive ? store.exclusive(id, inner) : inner()).then(
        (result) => {
          if (result && !result.acquired) resolve({ acquired: false })
        },
        (error: unknown) => {
          if (!answered) reject(error)
        },
      )
      if (answered) inBackground(held)
    })

  // Drives a stored intent under the store's cross-tab claim, re-reading it once the claim is held.
  const driveStored = async (
    id: string,
    transient: Record<string, string>,
    signal: AbortSignal | undefined,
    wait: boolean,
  ): Promise<Driven> => {
    for (;;) {
      const result = await claimed(id, async (defer): Promise<Driven> => {
        const record = await store.get(id)
        if (!record) return { skipped: 'not-pending' as const }
        if (record.state !== 'pending') return outcomeOf(record)
        return drive(ctx, record, transient, signal, { defer })
      })
      if (result.acquired) return result.value
      if (!wait) return { skipped: 'busy' }
      await sleep(timers, 250, signal)
    }
  }

  const request = async (req: RequestOptions): Promise<OncelyResponse> => {
    if (typeof req?.path !== 'string') throw new TypeError('Expected `path` to be a string')
    req.signal?.throwIfAborted() // cancelled before it began: record nothing
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
    const now = timers.now()
    const key = req.intentId === undefined ? randomKey() : deriveKey(req.intentId, method, url.href)
    req.onIntent?.({ id: req.intentId ?? key, key })
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
    // The write-ahead record already counts the first attempt, so it is the only write before the first byte.
    const run = async (): Promise<Driven> => {
      if (req.intentId === undefined) {
        // A fresh random key: nobody else can know this id before it is written, so the claim is requested
        // together with the write-ahead write and nothing needs re-reading under it.
        const written = store.set(record) // write-ahead: nothing is sent before this resolves
        written.catch(() => {}) // observed below; only keeps a failed write from being reported as unhandled
        const result = await claimed(record.id, async (defer) => {
          await written
          return drive(ctx, record, transient, req.signal, { counted: true, defer })
        })
        if (result.acquired) return result.value
        await written
        // Another process or tab (its resume()) claimed it first: wait for it, then take what it left.
        const stored = await driveStored(record.id, transient, req.signal, true)
        if ('skipped' in stored)
          throw new StorageError(`Intent ${record.id} vanished from the store before it was sent`)
        return stored
      }
      // A named intent may already exist, here or in another tab: read it under the claim, then either return its
      // outcome, drive it, or write this one ahead and drive it (no re-read needed: the claim is already held).
      for (;;) {
        const result = await claimed(record.id, async (defer): Promise<Driven> => {
          const existing = await store.get(record.id)
          const live =
            existing &&
            (existing.state === 'pending' || existing.state === 'expired' || (existing.keepUntil ?? 0) > now)
          if (existing && live) {
            if (!sameRequest(existing, record)) throw reusedLocally(existing)
            if (existing.state !== 'pending') return outcomeOf(existing)
            return drive(ctx, existing, transient, req.signal, { defer })
          }
          // Absent, or settled and forgotten: a fresh record derives the same key, so the server answers with
          // its stored response.
          await store.set(record) // write-ahead: nothing is sent before this resolves
          return drive(ctx, record, transient, req.signal, { counted: true, defer })
        })
        if (result.acquired) return result.value
        await sleep(timers, 250, req.signal) // another tab or process drives it: wait for its outcome
      }
    }
    for (;;) {
      const result = await track(record.id, record, run)
      if (!('skipped' in result)) return result
      // We joined a resume() that another tab pre-empted; now drive (or wait for) it ourselves.
    }
  }

  let resuming: Promise<ResumeOutcome[]> | undefined
  const resume = (): Promise<ResumeOutcome[]> => {
    resuming ??= (async () => {
      // Oldest first, a few at a time: thousands of intents left by an outage must not arrive as one burst.
      await drained()
      const records = (await store.list()).sort((a, b) => a.createdAt - b.createdAt)
      const now = timers.now()
      const outcomes = await mapLimit(
        records,
        resolved.resumeConcurrency,
        async (record): Promise<ResumeOutcome | undefined> => {
          if (record.state === 'settled' || record.state === 'failed') {
            // Housekeeping only: a failed delete is retried by the next resume().
            if ((record.keepUntil ?? 0) <= now)
              await store.delete(record.id, { durable: false }).catch(() => {})
            return undefined
          }
          if (record.state === 'expired') return undefined
          const base = { id: record.id, key: record.key }
          const target = { method: record.method, url: record.url }
          let result: Driven
          try {
            result = await track(record.id, undefined, () => driveStored(record.id, {}, undefined, false))
          } catch (error) {
            events.emit('resumed', { ...base, ...target, outcome: 'failed', error })
            return { ...base, outcome: 'failed', error }
          }
          if ('skipped' in result) return { ...base, outcome: 'skipped', reason: result.skipped }
          events.emit('resumed', { ...base, ...target, outcome: 'settled', response: result })
          return { ...base, outcome: 'settled', response: result }
        },
      )
      return outcomes.filter((outcome): outcome is ResumeOutcome => outcome !== undefined)
    })().finally(() => {
      resuming = undefined
    })
    return resuming
  }

  const stopWatching =
    options.resumeOnOnline !== false ? watchConnectivity(() => void resume().catch(() => {})) : () => {}
  if (options.resumeOnStart) queueMicrotask(() => void resume().catch(() => {}))

  return {
    request: request as OncelyClient['request'],
    mutation: (definition) => (json, extra) =>
      request({
        ...definition,
        ...extra,
        json,
        headers: { ...definition.headers, ...extra?.headers },
      }) as never,
    async pending() {
      await drained()
      const records = await store.list()
      return records
        .filter(
          (r): r is IntentRecord & { state: 'pending' | 'expired' } =>
            r.state === 'pending' || r.state === 'expired',
        )
        .map((r) => ({
          id: r.id,
          key: r.key,
          method: r.method,
          url: r.url,
          state: r.state,
          createdAt: r.createdAt,
          expiresAt: r.expiresAt,
          attempts: r.attempts,
          lastError: r.lastError,
        }))
    },
    resume,
    discard: (id) => store.delete(id),
    on: (event, listener) => events.on(event, listener),
    async close() {
      stopWatching()
      await drained()
      await store.close?.()
    },
  }
}

function sameRequest(a: IntentRecord, b: IntentRecord): boolean {
  return (
    a.method === b.method &&
    a.url === b.url &&
    JSON.stringify(a.body ?? null) === JSON.stringify(b.body ?? null)
  )
}

function reusedLocally(existing: IntentRecord): IdempotencyKeyReusedError {
  return new IdempotencyKeyReusedError(422, {
    headers: new Headers(),
    data: undefined,
    message: `Intent ${existing.id} is already recorded as ${existing.method} ${existing.url} with other bytes or target; use another intentId`,
  })
}

/** The stored outcome of a settled or failed intent, as the original call returned or threw it. */
function outcomeOf(record: IntentRecord): Promise<OncelyResponse> {
  if (record.state === 'expired') {
    return Promise.reject(
      new IntentExpiredError({ intentId: record.id, key: record.key, expiresAt: record.expiresAt }),
    )
  }
  const stored = record.outcome
  if (!stored) return Promise.reject(new OncelyError(`Intent ${record.id} ended without a stored response`))
  const headers = new Headers(stored.headers)
  if (record.state === 'failed') return Promise.reject(httpErrorFor(stored.status, headers, stored.text))
  return Promise.resolve({
    status: stored.status,
    headers,
    data: parseData(stored.text, headers),
    key: record.key,
    intentId: record.id,
    replayed: stored.replayed,
    attempts: record.attempts,
  })
}
