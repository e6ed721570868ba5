// Duplicate storm: `copies` identical requests per key fired at once (more than the database pool holds), key after
// key. Counts how many times the business INSERT ran per key, what the duplicates were answered, and how long it took.
import { performance } from 'node:perf_hooks'
import type pg from 'pg'
import { TRANSFER_BODY } from '../load.js'
import { percentile } from '../stats.js'

/** A request not answered by then counts as an error rather than hanging the run. */
const REQUEST_TIMEOUT_MS = 30_000

export interface StormResult {
  variant: string
  keys: number
  copies: number
  requests: number
  /** Ledger rows written for the storm's keys; `keys` means exactly once each. */
  executions: number
  /** Keys whose INSERT ran more than once. */
  duplicatedKeys: number
  statuses: Record<number, number>
  errors: number
  p50Ms: number
  p99Ms: number
  /** Time from the first copy of a key to the last answer, median over keys. */
  burstMs: number
}

export async function storm(options: {
  variant: string
  url: string
  pool: pg.Pool
  keys: number
  copies: number
}): Promise<StormResult> {
  const prefix = `storm-${options.variant}-${process.pid}-${Date.now().toString(36)}`
  const latencies: number[] = []
  const bursts: number[] = []
  const statuses: Record<number, number> = {}
  let errors = 0
  const keys: string[] = []
  for (let i = 0; i < options.keys; i++) {
    const key = `${prefix}-${i}`
    keys.push(key)
    const burstStart = performance.now()
    await Promise.all(
      Array.from({ length: options.copies }, async () => {
        const start = performance.now()
        try {
          const response = await fetch(`${options.url}/ledger`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'idempotency-key': key },
            body: TRANSFER_BODY,
            signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
          })
          await response.arrayBuffer()
          statuses[response.status] = (statuses[response.status] ?? 0) + 1
          latencies.push(performance.now() - start)
        } catch {
          errors++
        }
      }),
    )
    bursts.push(performance.now() - burstStart)
  }
  const { rows } = await options.pool.query<{ executions: string; duplicated: string }>(
    `SELECT coalesce(sum(n), 0) AS executions, count(*) FILTER (WHERE n > 1) AS duplicated
     FROM (SELECT request_key, count(*) AS n FROM ledger WHERE request_key = ANY($1) GROUP BY request_key) per_key`,
    [keys],
  )
  return {
    variant: options.variant,
    keys: options.keys,
    copies: options.copies,
    requests: options.keys * options.copies,
    executions: Number(rows[0]!.executions),
    duplicatedKeys: Number(rows[0]!.duplicated),
    statuses,
    errors,
    p50Ms: percentile(latencies, 50),
    p99Ms: percentile(latencies, 99),
    burstMs: percentile(bursts, 50),
  }
}
