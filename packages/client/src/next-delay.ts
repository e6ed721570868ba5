import { parseRetryAfter } from '@oncely/protocol'
import { isRetryableAnswer, PACED_MIN_MS, RETRY_AFTER_STATUSES } from './classify.js'
import { isHTTPError } from './errors/http-error.js'
import { isNetworkError } from './errors/network-error.js'
import { isReplayed } from './response.js'

/** The resolved retry budget. */
export interface RetryPolicy {
  limit: number
  minDelayMs: number
  maxDelayMs: number
  maxElapsedMs: number
  maxRetryAfterMs: number
}

/** Where a run of an intent stands after a failed attempt. */
export interface AttemptState {
  /** The retries so far that counted against `limit`: those the client paced itself. */
  counted: number
  /** When the run started, and now, by the client's clock (ms since the epoch). */
  startedAt: number
  now: number
  /** Source of randomness in [0, 1) for the jitter. */
  random: () => number
}

/** What follows a failed attempt. */
export type NextDelay =
  /**
   * Retry after `delayMs`. `retryAfter`: the server asked for that wait. `counted`: the retry counts against
   * `limit` (the client paces it, or the server asked for less than {@link PACED_MIN_MS}).
   */
  | { retry: true; delayMs: number; retryAfter: boolean; counted: boolean }
  /** Stop. With `exhausted`, the budget it names is spent and the intent stays pending; else the error is final. */
  | { retry: false; exhausted?: string }

/**
 * The retry decision after an attempt failed with `error` (a `NetworkError`, or the `HTTPError` of `response`).
 *
 * Retried: network errors and timeouts, and the statuses of {@link isRetryableAnswer} (408, 409, 429, 500, 502, 503,
 * 504; never a 422, a replayed answer or a response too large to store); any other error is final. The wait is
 * the server's `Retry-After` on 409, 429 and 503, measured against the response's `Date` and capped by
 * `maxRetryAfterMs`; otherwise full jitter, `random(0, min(maxDelayMs, minDelayMs * 2^counted))`. A `Retry-After`
 * of at least {@link PACED_MIN_MS} paces the retry itself and does not count against `limit`; every other retry
 * does, and none is scheduled past `limit` of them. No retry is scheduled whose wait would end after
 * `maxElapsedMs` from the start of the run.
 */
export function nextDelay(
  policy: RetryPolicy,
  attempt: AttemptState,
  error: unknown,
  response: { status: number; headers: Headers } | undefined,
): NextDelay {
  if (!isNetworkError(error)) {
    if (!isHTTPError(error) || !response) return { retry: false }
    if (!isRetryableAnswer(response.status, isReplayed(response.headers), error.problem))
      return { retry: false }
  }
  const retryAfter = isHTTPError(error) ? retryAfterOf(policy, attempt.now, response) : undefined
  const delayMs = retryAfter ?? fullJitter(policy, attempt.counted, attempt.random)
  const counted = retryAfter === undefined || retryAfter < PACED_MIN_MS
  if (counted && attempt.counted >= policy.limit) {
    return { retry: false, exhausted: `retry.limit of ${policy.limit} reached` }
  }
  if (attempt.now - attempt.startedAt + delayMs > policy.maxElapsedMs) {
    return { retry: false, exhausted: `retry.maxElapsedMs of ${policy.maxElapsedMs} ms reached` }
  }
  return { retry: true, delayMs, retryAfter: retryAfter !== undefined, counted }
}

// The server's Retry-After on 409, 429 and 503, capped; undefined when it sent none that parses.
function retryAfterOf(
  policy: RetryPolicy,
  now: number,
  response: { status: number; headers: Headers } | undefined,
): number | undefined {
  if (!response || !RETRY_AFTER_STATUSES.has(response.status)) return undefined
  const after = parseRetryAfter(response.headers.get('retry-after'), {
    date: response.headers.get('date'),
    now,
  })
  return after === undefined ? undefined : Math.min(after, policy.maxRetryAfterMs)
}

function fullJitter(policy: RetryPolicy, retry: number, random: () => number): number {
  const ceiling = Math.min(policy.maxDelayMs, policy.minDelayMs * 2 ** retry)
  return Math.floor(random() * ceiling)
}
