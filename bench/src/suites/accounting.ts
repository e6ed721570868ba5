// What each variant costs the database per request, counted rather than timed: round trips, statements and bytes
// each way between the bench server and Postgres (through the counting proxy of @oncely/test-support, in front of a
// server process of this suite's own, so the timed suites never pay for the proxy), and the WAL Postgres wrote.
// Requests are sent one at a time, so no two requests share a round trip (postgres.js would pipeline concurrent
// requests' statements on one connection), for each variant's first-execution path and then its replay path (the
// same keys again).
import http from 'node:http'
import { countingProxy, type WireCounts } from '@oncely/test-support'
import type pg from 'pg'
import { TRANSFER_BODY } from '../load.js'
import { startServer } from '../server/process.js'
import { median } from '../stats.js'

export interface AccountingRow {
  variant: string
  path: 'first' | 'replay'
  /** Requests per round. */
  requests: number
  /** Per request, medians over rounds (they are counts: rounds agree unless a pool opened a connection). */
  roundTrips: number
  statements: number
  bytesToPostgres: number
  bytesFromPostgres: number
  /**
   * WAL bytes per request: the least over rounds of the WAL position's advance divided by the requests. The position
   * is the whole cluster's, which other databases on a shared server also advance, so the least round is the best
   * reading (they can only add).
   */
  walBytes: number
  /** Connections the variant opened through the proxy during the timed rounds (0 once its pool is warm). */
  connectionsOpened: number
  /** Responses that were not 2xx, over all rounds (should be 0). */
  failures: number
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })

/** POSTs one transfer with `key` and resolves with the status once the response has been read. */
function post(url: string, key: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const request = http.request(
      `${url}/ledger`,
      { method: 'POST', agent, headers: { 'content-type': 'application/json', 'idempotency-key': key } },
      (response) => {
        response.resume()
        response.on('end', () => resolve(response.statusCode ?? 0))
      },
    )
    request.on('error', reject)
    request.end(TRANSFER_BODY)
  })
}

async function walPosition(pool: pg.Pool): Promise<bigint> {
  const { rows } = await pool.query<{ lsn: string }>('SELECT pg_current_wal_insert_lsn()::text AS lsn')
  const [hi, lo] = rows[0]!.lsn.split('/')
  return (BigInt(`0x${hi}`) << 32n) + BigInt(`0x${lo}`)
}

const delta = (after: WireCounts, before: WireCounts, n: number) => ({
  roundTrips: (after.roundTrips - before.roundTrips) / n,
  statements: (after.statements - before.statements) / n,
  bytesToPostgres: (after.bytesToPostgres - before.bytesToPostgres) / n,
  bytesFromPostgres: (after.bytesFromPostgres - before.bytesFromPostgres) / n,
  connections: after.connections - before.connections,
})

export async function accounting(options: {
  databaseUrl: string
  redisUrl: string
  poolSize: number
  variants: readonly string[]
  /** A pool on the bench database, not through the proxy, for the WAL position. */
  pool: pg.Pool
  requests: number
  rounds: number
  log: (line: string) => void
}): Promise<AccountingRow[]> {
  const proxy = await countingProxy(options.databaseUrl)
  const server = await startServer({
    databaseUrl: proxy.url,
    redisUrl: options.redisUrl,
    poolSize: options.poolSize,
    variants: options.variants,
  })
  const rows: AccountingRow[] = []
  try {
    for (const variant of options.variants) {
      const url = server.urls[variant]
      if (!url) continue
      const prefix = `acct-${variant}-${process.pid}-${Date.now().toString(36)}`
      // Warm: connections opened, statements prepared, the replay path taken once.
      for (let i = 0; i < 20; i++) await post(url, `${prefix}-warm-${i}`)
      for (let i = 0; i < 20; i++) await post(url, `${prefix}-warm-${i}`)
      for (const path of ['first', 'replay'] as const) {
        const samples: ReturnType<typeof delta>[] = []
        const wal: number[] = []
        let failures = 0
        for (let round = 0; round < options.rounds; round++) {
          const before = proxy.counts()
          const wal0 = await walPosition(options.pool)
          for (let i = 0; i < options.requests; i++) {
            const status = await post(url, `${prefix}-${round}-${i}`)
            if (status < 200 || status >= 300) failures++
          }
          wal.push(Number((await walPosition(options.pool)) - wal0) / options.requests)
          samples.push(delta(proxy.counts(), before, options.requests))
        }
        const row: AccountingRow = {
          variant,
          path,
          requests: options.requests,
          roundTrips: median(samples.map((s) => s.roundTrips)),
          statements: median(samples.map((s) => s.statements)),
          bytesToPostgres: median(samples.map((s) => s.bytesToPostgres)),
          bytesFromPostgres: median(samples.map((s) => s.bytesFromPostgres)),
          walBytes: Math.min(...wal),
          connectionsOpened: samples.reduce((n, s) => n + s.connections, 0),
          failures,
        }
        rows.push(row)
        options.log(
          `  ${variant.padEnd(24)} ${path.padEnd(6)} ${row.roundTrips.toFixed(2)} round trips, ${row.statements.toFixed(2)} statements, ${row.bytesToPostgres.toFixed(0)} B to / ${row.bytesFromPostgres.toFixed(0)} B from Postgres, ${row.walBytes.toFixed(0)} B WAL per request${failures ? `, ${failures} failures` : ''}`,
        )
      }
    }
  } finally {
    await server.stop()
    await proxy.close()
  }
  return rows
}
