import type { RetryPolicy } from './next-delay.js'
import type { IntentStore } from './store.js'
import type { Timers } from './timers.js'
import { OptionChecks } from './validate.js'

/** Retry budget of one run of an intent (a `request`, or one intent inside `resume()`). */
export interface RetryOptions {
  /**
   * Retries the client paces itself, after the first attempt: after a network error, a timeout, or a retryable
   * status without a `Retry-After` of at least one second. Retries that wait a `Retry-After` the server asked for
   * (on 409, 429 and 503) do not count: `maxElapsedMs` bounds those, so a duplicate of a request still in flight
   * keeps asking for as long as the server says it is in flight.
   * @default 8
   * @example 3
   */
  limit?: number
  /**
   * Base of the exponential backoff: retry n waits `random(0, min(maxDelayMs, minDelayMs * 2^n))` (full jitter).
   * @default 200
   * @example 500
   */
  minDelayMs?: number
  /**
   * Ceiling of one backoff wait.
   * @default 30_000
   * @example 10_000
   */
  maxDelayMs?: number
  /**
   * Total time one run may take, waits included; no retry is scheduled that would end later. This is the budget
   * of the waits a server asks for (`Retry-After` on 409, 429 and 503), which `limit` does not count: with the
   * default, a duplicate of a request that holds its key for up to about two minutes gets that request's answer.
   * @default 120_000
   * @example 30_000
   */
  maxElapsedMs?: number
  /**
   * Ceiling for a server's `Retry-After` (on 409, 429 and 503); a longer value waits this long instead.
   * @default 60_000
   * @example 5_000
   */
  maxRetryAfterMs?: number
}

/** Options of {@link createClient}. */
export interface ClientOptions {
  /**
   * Absolute URL that request paths are resolved against. Required.
   * @default none: required
   * @example 'https://api.example.com'
   */
  baseUrl: string
  /**
   * Where intents are written before they are sent.
   * @default indexedDbStore() in browsers, memoryStore() elsewhere (with a console warning)
   * @example fileStore({ dir: '.oncely' })
   */
  store?: IntentStore
  /**
   * Headers resolved for every attempt and never persisted: put credentials here.
   * @default none
   * @example async () => ({ authorization: `Bearer ${await getToken()}` })
   */
  headers?: () => Record<string, string> | Promise<Record<string, string>>
  /**
   * The retry budget of one run (see {@link RetryOptions} for each field's default).
   * @default { limit: 8, minDelayMs: 200, maxDelayMs: 30_000, maxElapsedMs: 120_000, maxRetryAfterMs: 60_000 }
   * @example { limit: 3, maxElapsedMs: 30_000 }
   */
  retry?: RetryOptions
  /**
   * Time after which one attempt is abandoned (and retried), in ms; `false` for none.
   * @default 30_000
   * @example 10_000
   */
  timeoutMs?: number | false
  /**
   * Age after which an intent is never resent, because the server may have forgotten its key. Keep it below the
   * server's key retention.
   * @default 82_800_000 (23 hours)
   * @example 3_600_000
   */
  intentTtlMs?: number
  /**
   * How long a settled intent with an `intentId` keeps its outcome (status, headers other than `set-cookie` and the
   * hop-by-hop ones, body text) in the store, so calling `request` again with the same `intentId` returns it
   * (`source: 'store'`) instead of sending again. Older outcomes are deleted by the next `resume()`. `0` keeps
   * nothing: an intent is deleted as soon as its answer arrives.
   * @default 600_000 (10 minutes)
   * @example 0
   */
  settledTtlMs?: number
  /**
   * Calls `resume()` once right after creation, for intents left by a previous page or process.
   * @default false
   * @example true
   */
  resumeOnStart?: boolean
  /**
   * How many intents `resume()` sends at once (each with its own retries); the rest wait their turn, oldest first,
   * so a backlog left by an outage does not hit the server as one burst.
   * @default 4
   * @example 1
   */
  resumeConcurrency?: number
  /**
   * In browsers, calls `resume()` on the `online` event and when the page becomes visible. Removed by `close()`.
   * @default true
   * @example false
   */
  resumeOnOnline?: boolean
  /**
   * The `fetch` to send with.
   * @default globalThis.fetch, read at call time
   * @example (input, init) => fetch(input, { ...init, keepalive: true })
   */
  fetch?: typeof fetch
  /**
   * Clock and timers; the defaults read the globals at call time, so fake timers work.
   * @default { now: () => Date.now(), setTimeout, clearTimeout } of globalThis, read at call time
   * @example { now: () => clock.now(), setTimeout: clock.setTimeout, clearTimeout: clock.clearTimeout }
   */
  timers?: Timers
  /**
   * Source of randomness in [0, 1) for the backoff jitter.
   * @default Math.random
   * @example () => 0.5
   */
  random?: () => number
}

/** Options after defaults. */
export interface ResolvedOptions {
  baseUrl: URL
  retry: RetryPolicy
  timeoutMs: number | false
  intentTtlMs: number
  settledTtlMs: number
  resumeConcurrency: number
}

/**
 * Applies defaults and validates, throwing one `TypeError` that names every bad option (not only the first).
 */
export function resolveOptions(options: ClientOptions): ResolvedOptions {
  const checks = new OptionChecks('createClient', options)
  let baseUrl = new URL('http://invalid.invalid')
  try {
    baseUrl = new URL(options.baseUrl)
  } catch {
    checks.problem(`Expected \`baseUrl\` to be an absolute URL, got ${String(options.baseUrl)}`)
  }
  for (const name of ['headers', 'fetch', 'random'] as const) checks.fn(name, options[name])
  for (const name of ['resumeOnStart', 'resumeOnOnline'] as const) checks.boolean(name, options[name])
  const timers = options.timers
  if (timers !== undefined) {
    for (const method of ['now', 'setTimeout', 'clearTimeout'] as const) {
      if (typeof timers?.[method] !== 'function')
        checks.problem(`Expected \`timers.${method}\` to be a function`)
    }
  }
  const store = options.store
  if (store !== undefined) {
    for (const method of ['get', 'set', 'delete', 'list'] as const) {
      if (typeof store?.[method] !== 'function') {
        checks.problem(`Expected \`store.${method}\` to be a function (see the IntentStore interface)`)
      }
    }
  }
  const r = options.retry ?? {}
  const retry: RetryPolicy = {
    limit: checks.number('retry.limit', r.limit, 8, 0, true),
    minDelayMs: checks.number('retry.minDelayMs', r.minDelayMs, 200, 0),
    maxDelayMs: checks.number('retry.maxDelayMs', r.maxDelayMs, 30_000, 0),
    maxElapsedMs: checks.number('retry.maxElapsedMs', r.maxElapsedMs, 120_000, 0),
    maxRetryAfterMs: checks.number('retry.maxRetryAfterMs', r.maxRetryAfterMs, 60_000, 0),
  }
  const resolved: ResolvedOptions = {
    baseUrl,
    retry,
    timeoutMs: options.timeoutMs === false ? false : checks.number('timeoutMs', options.timeoutMs, 30_000, 1),
    intentTtlMs: checks.number('intentTtlMs', options.intentTtlMs, 23 * 60 * 60 * 1000, 1),
    settledTtlMs: checks.number('settledTtlMs', options.settledTtlMs, 10 * 60 * 1000, 0),
    resumeConcurrency: checks.number('resumeConcurrency', options.resumeConcurrency, 4, 1, true),
  }
  checks.done()
  return resolved
}
