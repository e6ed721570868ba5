// One load run with autocannon's programmatic API: a fixed number of POST requests over `connections` keep-alive
// connections, each with the key `nextKey()` returns. Latencies are taken from autocannon's per-response event (float
// milliseconds) rather than its integer-millisecond histogram, because the differences measured here are fractions of
// a millisecond.
import { performance } from 'node:perf_hooks'
import autocannon from 'autocannon'
import { percentile } from './stats.js'

export const TRANSFER_BODY = JSON.stringify({ account: 'acct-42', amount: 1250 })

export interface LoadOptions {
  /**
   * The server, or several instances of it: the connections are then dealt out round-robin (connection i to
   * instance i mod n), as a client-side balancer with keep-alive connections spreads them.
   */
  url: string | readonly string[]
  connections: number
  amount: number
  nextKey: () => string
  /** @default '/ledger' */
  path?: string
  /** @default TRANSFER_BODY */
  body?: string
  /** Headers that depend on the request's key (a tenant, say). @default none */
  headersFor?: (key: string) => Record<string, string>
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
  const urls = typeof options.url === 'string' ? [options.url] : options.url
  if (urls.length === 0 || options.connections < urls.length)
    throw new TypeError(`load: ${options.connections} connections cannot cover ${urls.length} instances`)
  const latencies: number[] = []
  const statuses: Record<number, number> = {}
  const started = performance.now()
  let lastResponse = started
  // One autocannon per instance, all in this process and sharing `nextKey`, so the key sequence is dealt out as
  // requests are sent whichever instance they go to.
  const share = (total: number, i: number) =>
    Math.floor(total / urls.length) + (i < total % urls.length ? 1 : 0)
  const results = await Promise.all(
    urls.map((url, i) => {
      const instance = autocannon({
        url: `${url}${options.path ?? '/ledger'}`,
        connections: share(options.connections, i),
        amount: share(options.amount, i),
        timeout: 30,
        requests: [
          {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: options.body ?? TRANSFER_BODY,
            setupRequest: (request) => {
              const key = options.nextKey()
              return {
                ...request,
                headers: { ...request.headers, ...options.headersFor?.(key), 'idempotency-key': key },
              }
            },
          },
        ],
      })
      instance.on('response', (_client, status, _bytes, ms) => {
        lastResponse = performance.now()
        statuses[status] = (statuses[status] ?? 0) + 1
        latencies.push(ms)
      })
      return instance
    }),
  )
  // autocannon notices that `amount` is reached on its 1-second tick; the wall time until the last response is the
  // real duration (otherwise every rate is the amount divided by a whole number of seconds).
  const seconds = (lastResponse - started) / 1000
  return {
    requests: latencies.length,
    rps: latencies.length / seconds,
    p50: percentile(latencies, 50),
    p99: percentile(latencies, 99),
    statuses,
    errors: results.reduce((sum, result) => sum + result.errors + result.timeouts, 0),
  }
}

/**
 * First executions a server process of its own serves before it is measured. V8 compiles a process's hot functions
 * over its first few thousand requests: a fresh bench server spent about a second compiling per 1,000 requests over
 * its first 2,000 and settled after about 6,000 (counted with `--trace-opt`, `oncely-lock` and `sql-floor` alike). A
 * measurement that starts earlier also charges each variant for compiling its code, the more so the more code it has.
 * 10,000 also fills oncely's replay cache to its default bound, as in a server that has run a while: while it fills,
 * its heap grows page by page (2.4 minor page faults per request, against 0.1 to 0.3 once full).
 */
export const PROCESS_WARM_UP = 10_000

/**
 * Brings a freshly started server to its steady state: {@link PROCESS_WARM_UP} first executions, then replays of the
 * last 2,000 of them (so the replay path is compiled too).
 */
export async function warmUpProcess(url: string, prefix: string): Promise<void> {
  await load({ url, connections: 10, amount: PROCESS_WARM_UP, nextKey: keySequence(prefix) })
  const replayed = PROCESS_WARM_UP - 2_000
  let next = 0
  await load({ url, connections: 10, amount: 2_000, nextKey: () => `${prefix}-${replayed + next++}` })
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
