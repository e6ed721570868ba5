import { describe, expect, it } from 'vitest'
import { NetworkError } from '../src/errors/network-error.js'
import { nextDelay, type RetryPolicy } from '../src/next-delay.js'
import { httpErrorFor } from '../src/response.js'

// The retry decision alone, without a client: what follows one failed attempt. (retry.test.ts checks the same rules
// through a client against real HTTP answers.)
const policy: RetryPolicy = {
  limit: 3,
  minDelayMs: 100,
  maxDelayMs: 1_000,
  maxElapsedMs: 60_000,
  maxRetryAfterMs: 30_000,
}
const start = { counted: 0, startedAt: 1_000_000, now: 1_000_000, random: () => 0.5 }

function answer(status: number, headers: Record<string, string> = {}, body = '') {
  const response = { status, headers: new Headers(headers) }
  return { error: httpErrorFor(status, response.headers, body), response }
}

describe('nextDelay', () => {
  it('retries a network error with full jitter, and counts it', () => {
    expect(nextDelay(policy, start, new NetworkError(new Error('reset'), false), undefined)).toEqual({
      retry: true,
      delayMs: 50, // random 0.5 of min(1000, 100 * 2^0)
      retryAfter: false,
      counted: true,
    })
    expect(
      nextDelay(policy, { ...start, counted: 2 }, new NetworkError('reset', false), undefined),
    ).toMatchObject({
      delayMs: 200, // 0.5 of 100 * 2^2
    })
  })

  it('never retries a 422, a replayed answer, a 4xx other than 408/409/429, or an error that is not an attempt failure', () => {
    for (const [status, headers] of [
      [422, {}],
      [400, {}],
      [404, {}],
      [503, { 'idempotent-replayed': 'true' }],
    ] as const) {
      const { error, response } = answer(status, headers)
      expect(nextDelay(policy, start, error, response), `${status}`).toEqual({ retry: false })
    }
    expect(nextDelay(policy, start, new Error('the store failed'), undefined)).toEqual({ retry: false })
  })

  it('waits the Retry-After of a 409, 429 or 503, capped, and does not count a wait of a second or more', () => {
    for (const status of [409, 429, 503]) {
      const { error, response } = answer(status, { 'retry-after': '2' })
      expect(nextDelay(policy, start, error, response)).toEqual({
        retry: true,
        delayMs: 2_000,
        retryAfter: true,
        counted: false,
      })
    }
    const long = answer(503, { 'retry-after': '3600' })
    expect(nextDelay(policy, start, long.error, long.response)).toMatchObject({ delayMs: 30_000 })
    const short = answer(429, { 'retry-after': '0' })
    expect(nextDelay(policy, start, short.error, short.response)).toMatchObject({ delayMs: 0, counted: true })
  })

  it('ignores Retry-After on other statuses', () => {
    const { error, response } = answer(500, { 'retry-after': '5' })
    expect(nextDelay(policy, start, error, response)).toEqual({
      retry: true,
      delayMs: 50,
      retryAfter: false,
      counted: true,
    })
  })

  it('stops after retry.limit counted retries, but not for waits the server paces', () => {
    const spent = { ...start, counted: 3 }
    expect(nextDelay(policy, spent, new NetworkError('reset', false), undefined)).toEqual({
      retry: false,
      exhausted: 'retry.limit of 3 reached',
    })
    const paced = answer(409, { 'retry-after': '1' })
    expect(nextDelay(policy, spent, paced.error, paced.response)).toMatchObject({
      retry: true,
      counted: false,
    })
  })

  it('schedules no retry whose wait would end after retry.maxElapsedMs', () => {
    const late = { ...start, now: start.startedAt + 59_000 }
    const { error, response } = answer(409, { 'retry-after': '2' })
    expect(nextDelay(policy, late, error, response)).toEqual({
      retry: false,
      exhausted: 'retry.maxElapsedMs of 60000 ms reached',
    })
    const justInTime = { ...start, now: start.startedAt + 58_000 }
    expect(nextDelay(policy, justInTime, error, response)).toMatchObject({ retry: true, delayMs: 2_000 })
  })
})
