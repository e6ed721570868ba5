// One load run with autocannon's programmatic API: a fixed number of POST /ledger requests over `connections`
// keep-alive connections, each with the key `nextKey()` returns. Latencies are taken from autocannon's per-response
// event (float milliseconds) rather than its integer-millisecond histogram, because the differences measured here
// are fractions of a millisecond.
import { performance } from 'node:perf_hooks'
import autocannon from 'autocannon'
import { percentile } from './stats.js'

export const TRANSFER_BODY = JSON.stringify({ account: 'acct-42', amount: 1250 })

export interface LoadOptions {
  url: string
  connections: number
  amount: number
  nextKey: () => string
}

export interface LoadResult {
  requests: number
  /** Completed requests per second of wall time. */
  rps: number
  p50: number
  p99: number
  /** Count per HTTP status. */
  statuses: Record<number, number>
  errors: number
}

export async function load(options: LoadOptions): Promise<LoadResult> {
  const latencies: number[] = []
  const statuses: Record<number, number> = {}
  const started = performance.now()
  const instance = autocannon({
    url: `${options.url}/ledger`,
    connections: options.connections,
    amount: options.amount,
    timeout: 30,
    requests: [
      {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: TRANSFER_BODY,
        setupRequest: (request) => ({
          ...request,
          headers: { ...request.headers, 'idempotency-key': options.nextKey() },
        }),
      },
    ],
  })
  let lastResponse = started
  instance.on('response', (_client, status, _bytes, ms) => {
    lastResponse = performance.now()
    statuses[status] = (statuses[status] ?? 0) + 1
    latencies.push(ms)
  })
  const result = await instance
  // autocannon notices that `amount` is reached on its 1-second tick; the wall time until the last response is the
  // real duration (otherwise every rate is the amount divided by a whole number of seconds).
  const seconds = (lastResponse - started) / 1000
  return {
    requests: latencies.length,
    rps: latencies.length / seconds,
    p50: percentile(latencies, 50),
    p99: percentile(latencies, 99),
    statuses,
    errors: result.errors + result.timeouts,
  }
}

/** A key generator: `<prefix>-0`, `<prefix>-1`, ... wrapping around after `size` keys when `size` is given. */
export function keySequence(prefix: string, size?: number): () => string {
  let next = 0
  return () => {
    const index = size === undefined ? next : next % size
    next++
    return `${prefix}-${index}`
  }
}
