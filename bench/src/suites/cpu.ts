// Where a request's CPU goes: the bench server process, every Postgres process (backends, WAL writer, checkpointer,
// autovacuum), and the load generator, per request, for each variant's first-execution path at 10 connections.
// Read from /proc (Linux, Postgres on this machine), so it is skipped elsewhere. Also counts the server's write
// system calls per request: each is a round trip on loopback TCP, which costs CPU on both sides.
import { randomUUID } from 'node:crypto'
import { load } from '../load.js'
import { cpuSeconds, postgresSeconds, writeCalls } from '../proc.js'

export interface CpuSplit {
  variant: string
  requests: number
  /** Medians over rounds, microseconds of CPU (user + system) per request. */
  serverUs: number
  postgresUs: number
  loadUs: number
  /** Write system calls of the server process per request (database round trips plus the HTTP response). */
  writesPerRequest: number
  rps: number
}

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!

export async function cpuSplit(options: {
  urls: Record<string, string>
  serverPid: number
  variants: readonly string[]
  requests: number
  rounds: number
  log: (line: string) => void
}): Promise<CpuSplit[]> {
  const samples = new Map<
    string,
    { server: number[]; postgres: number[]; load: number[]; writes: number[]; rps: number[] }
  >()
  for (let round = 0; round < options.rounds; round++) {
    for (const variant of options.variants) {
      const url = options.urls[variant]
      if (!url) continue
      const server0 = cpuSeconds(options.serverPid)
      const writes0 = writeCalls(options.serverPid)
      const postgres0 = postgresSeconds()
      const load0 = process.cpuUsage()
      const result = await load({
        url,
        connections: 10,
        amount: options.requests,
        nextKey: () => randomUUID(),
      })
      const load1 = process.cpuUsage(load0)
      const n = options.requests
      const entry = samples.get(variant) ?? { server: [], postgres: [], load: [], writes: [], rps: [] }
      entry.server.push(((cpuSeconds(options.serverPid) - server0) * 1e6) / n)
      entry.postgres.push(((postgresSeconds() - postgres0) * 1e6) / n)
      entry.load.push((load1.user + load1.system) / n)
      entry.writes.push((writeCalls(options.serverPid) - writes0) / n)
      entry.rps.push(result.rps)
      samples.set(variant, entry)
      options.log(
        `  round ${round + 1} ${variant.padEnd(28)} server ${entry.server.at(-1)!.toFixed(0)} us, postgres ${entry.postgres.at(-1)!.toFixed(0)} us, load ${entry.load.at(-1)!.toFixed(0)} us per request`,
      )
    }
  }
  return [...samples].map(([variant, s]) => ({
    variant,
    requests: options.requests,
    serverUs: median(s.server),
    postgresUs: median(s.postgres),
    loadUs: median(s.load),
    writesPerRequest: median(s.writes),
    rps: median(s.rps),
  }))
}
