// Where a request's CPU goes: the bench server process, the Postgres backends serving the bench database, every
// Postgres process (backends of every database, WAL writer, checkpointer, autovacuum: on a shared server, other
// databases' work too), and the load generator, per request, for each variant's first-execution and replay paths at
// 10 connections. Read from /proc (Linux, Postgres on this machine), so it is skipped elsewhere. Also counts the
// server's write system calls per request: each is a round trip on loopback TCP, which costs CPU on both sides.
import { randomUUID } from 'node:crypto'
import type pg from 'pg'
import { keySequence, load } from '../load.js'
import { cpuDelta, cpuSeconds, postgresProcesses, writeCalls } from '../proc.js'
import { median } from '../stats.js'

export interface CpuSplit {
  variant: string
  path: 'first' | 'replay'
  requests: number
  /** Medians over rounds, microseconds of CPU (user + system) per request. */
  serverUs: number
  /** The server's CPU per request in each round, in round order: a comparison pairs the rounds of two variants. */
  serverRoundsUs: number[]
  /** The backends connected to the bench database (the server's pools), read by their pids. */
  backendUs: number
  /** Every process named postgres on the machine. */
  postgresUs: number
  loadUs: number
  /** Write system calls of the server process per request (database round trips plus the HTTP response). */
  writesPerRequest: number
  rps: number
}

/** First executions run right before a measured one, outside it. */
const WARM_UP = 200

/** CPU seconds so far of each backend connected to the pool's database, other than the pool's own. */
async function backends(pool: pg.Pool): Promise<Map<number, number>> {
  const { rows } = await pool.query<{ pid: number }>(
    'SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()',
  )
  return new Map(rows.map((r) => [r.pid, cpuSeconds(r.pid)]))
}

export async function cpuSplit(options: {
  /**
   * Each variant measured, and its server: its URL and the pid of a process that serves it alone, warmed up (see
   * warmUpProcess). In a shared process a variant's CPU would include what the others do there: the collector
   * walking their heaps, their replay caches' checks.
   */
  servers: Record<string, { url: string; pid: number }>
  /** A pool on the bench database, to find its backends. */
  pool: pg.Pool
  requests: number
  rounds: number
  log: (line: string) => void
}): Promise<CpuSplit[]> {
  type Samples = Record<'server' | 'backend' | 'postgres' | 'load' | 'writes' | 'rps', number[]>
  const samples = new Map<string, Samples>()
  const servers = Object.entries(options.servers)
  for (let round = 0; round < options.rounds; round++) {
    for (const [variant, { url, pid }] of servers) {
      for (const path of ['first', 'replay'] as const) {
        let nextKey: () => string = () => randomUUID()
        // The pool at its size and its backends started before the measurement: the bench server's pools give idle
        // connections back after a second, and a run that opens ten would count their start-up (and the first
        // planning of each prepared statement) against 500 requests, several hundred microseconds each.
        if (path === 'first') await load({ url, connections: 10, amount: WARM_UP, nextKey })
        if (path === 'replay') {
          // The keys replayed are executed first, outside the measurement.
          const prefix = `cpu-${variant}-${round}-${randomUUID()}`
          await load({ url, connections: 10, amount: options.requests, nextKey: keySequence(prefix) })
          nextKey = keySequence(prefix)
        }
        const server0 = cpuSeconds(pid)
        const writes0 = writeCalls(pid)
        const backends0 = await backends(options.pool)
        const postgres0 = postgresProcesses()
        const load0 = process.cpuUsage()
        const result = await load({ url, connections: 10, amount: options.requests, nextKey })
        const load1 = process.cpuUsage(load0)
        const postgres1 = postgresProcesses()
        const backends1 = await backends(options.pool)
        const n = options.requests
        const id = `${variant} ${path}`
        const entry = samples.get(id) ?? {
          server: [],
          backend: [],
          postgres: [],
          load: [],
          writes: [],
          rps: [],
        }
        entry.server.push(((cpuSeconds(pid) - server0) * 1e6) / n)
        entry.backend.push((cpuDelta(backends0, backends1) * 1e6) / n)
        entry.postgres.push((cpuDelta(postgres0, postgres1) * 1e6) / n)
        entry.load.push((load1.user + load1.system) / n)
        entry.writes.push((writeCalls(pid) - writes0) / n)
        entry.rps.push(result.rps)
        samples.set(id, entry)
        options.log(
          `  round ${round + 1} ${id.padEnd(32)} server ${entry.server.at(-1)!.toFixed(0)} us, backends ${entry.backend.at(-1)!.toFixed(0)} us, all postgres ${entry.postgres.at(-1)!.toFixed(0)} us, load ${entry.load.at(-1)!.toFixed(0)} us per request`,
        )
      }
    }
  }
  return [...samples].map(([id, s]) => {
    const [variant, path] = id.split(' ') as [string, 'first' | 'replay']
    return {
      variant,
      path,
      requests: options.requests,
      serverUs: median(s.server),
      serverRoundsUs: s.server,
      backendUs: median(s.backend),
      postgresUs: median(s.postgres),
      loadUs: median(s.load),
      writesPerRequest: median(s.writes),
      rps: median(s.rps),
    }
  })
}
