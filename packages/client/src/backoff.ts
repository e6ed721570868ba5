import { parseRetryAfter } from '@oncely/protocol'
import { RETRY_AFTER_STATUSES } from './classify.js'

/** The resolved retry budget. */
export interface RetryPolicy {
  limit: number
  minDelayMs: number
  maxDelayMs: number
  maxElapsedMs: number
  maxRetryAfterMs: number
}

/**
 * The wait before retry number `retry` (0 for the first retry): the server's `Retry-After` on 409/429/503, measured
 * against the response's `Date` and capped by `maxRetryAfterMs`; otherwise full jitter,
 * `random(0, min(maxDelayMs, minDelayMs * 2^retry))`.
 */
export function retryDelay(
  policy: RetryPolicy,
  retry: number,
  random: () => number,
  now: number,
  response?: { status: number; headers: Headers },
): { delayMs: number; retryAfter: boolean } {
  if (response && RETRY_AFTER_STATUSES.has(response.status)) {
    const after = parseRetryAfter(response.headers.get('retry-after'), {
      date: response.headers.get('date'),
      now,
    })
    if (after !== undefined) return { delayMs: Math.min(after, policy.maxRetryAfterMs), retryAfter: true }
  }
  const ceiling = Math.min(policy.maxDelayMs, policy.minDelayMs * 2 ** retry)
  return { delayMs: Math.floor(random() * ceiling), retryAfter: false }
}
