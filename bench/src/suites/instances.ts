// Instances: 1, 2, 4... processes of the demo payments API (apps/payments-api) sharing one Postgres, under the demo's
// own workload, with the load's connections dealt out round-robin over the instances. Next to each run it reads
// where the CPU went (instances, Postgres, load generator), how busy the whole machine was, and what each request
// cost Postgres in commits and WAL syncs: on a machine where all of them share a few cores, that says whether adding
// instances could have helped. Then it sizes the key table from the rows those payments wrote, and times the reaper.
import { type ChildProcess, spawn } from 'node:child_process'
import os from 'node:os'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import { createTestDatabase, waitFor } from '@oncely/test-support'
import type pg from 'pg'
import { load } from '../load.js'
import { cpuSeconds, machineTicks } from '../proc.js'
import { median } from '../stats.js'
import { type ReaperResult, reaperThroughput } from './scale.js'

const API_DIR = fileURLToPath(new URL('../../../apps/payments-api/', import.meta.url))
const ONCELY_KEYS = 'oncely.idempotency_keys'
/** The engine's default `retentionMs` (and the demo's `ONCELY_RETENTION_MS` default): 24 hours. */
const DEFAULT_RETENTION_MS = 86_400_000
/** Tenants the keys are spread over (`Authorization: Bearer <tenant>`, the key record's scope). */
const TENANTS = 8
const PAYMENT_BODY = JSON.stringify({ amount: 1250, currency: 'eur' })
/** Postgres flushes a backend's statistics at most once a second: wait that long before reading them. */
const STATS_FLUSH_MS = 1_100

export type Workload = 'first' | 'mix'

export interface InstancesRun {
  instances: number
  workload: Workload
  connections: number
  requests: number
  /** Medians over rounds. */
  rps: number
  /** Each round's req/s, in order: on a shared machine one disturbed round shows here. */
  rpsRounds: number[]
  p50Ms: number
  p99Ms: number
  /** Statuses summed over rounds. */
  statuses: Record<number, number>
  errors: number
  /** Payment rows per fresh key, over all rounds: 1 is exactly once. */
  paymentsPerFreshKey: number
  /** Share of the machine's CPU time (all cores) that was busy during the run, and waiting for the disk. */
  machineBusy: number
  machineIowait: number
  /** 1-minute load average at the end of the run. */
  loadAverage: number
  /**
   * Microseconds of CPU per request: all instances together; Postgres (this database's backends and the server's
   * background processes); the load generator.
   */
  instancesUs: number
  postgresUs: number
  loadUs: number
  /**
   * Transactions committed in the suite's database per request; WAL syncs and bytes of the whole server per request
   * (on a shared server they include other databases' writes).
   */
  commitsPerRequest: number
  walSyncsPerRequest: number
  walBytesPerRequest: number
}

export interface KeyTableSize {
  /** Key rows the measured payments left (one per key). */
  rows: number
  /** Bytes per row as the runs left the table (dead row versions and free space included): heap, indexes, TOAST. */
  asWritten: { heap: number; indexes: number; toast: number; total: number }
  /** Bytes per row after `VACUUM FULL` rewrote it compactly. */
  compacted: { heap: number; indexes: number; toast: number; total: number }
  /** The peak first-execution rate measured, its keys per day, and the table at the default retention. */
  peakInsertRps: number
  keysPerDay: number
  retentionHours: number
  bytesAtRetention: { asWritten: number; compacted: number }
  reaper: ReaperResult
}

export interface InstancesResult {
  reservation: 'lock' | 'row'
  rounds: number
  runs: InstancesRun[]
  keyTable: KeyTableSize
}

interface ApiInstance {
  url: string
  pid: number
  stop(): Promise<void>
}

/** The line the payments API prints once it listens, with the port it bound. */
const LISTENING = /payments-api: listening at http:\/\/127\.0\.0\.1:(\d+)\//

/**
 * Starts one payments API process on a port of its own (PORT=0: it binds one and prints it, so no other process can
 * take the port in between) and waits until `/healthz` says its database is ready.
 */
async function startInstance(databaseUrl: string, reservation: 'lock' | 'row'): Promise<ApiInstance> {
  let url: string | undefined
  // The API's own TypeScript runs through tsx, but @oncely/* resolve to their built dist (no `@oncely/source`
  // condition), as an application installing them would run them; `pnpm bench` builds them first.
  const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts'], {
    cwd: API_DIR,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: {
      ...process.env,
      PORT: '0',
      HOST: '127.0.0.1',
      DATABASE_URL: databaseUrl,
      ONCELY_RESERVATION: reservation,
      // The default 'info' writes a log line per request, which would be measured as the API's cost.
      LOG_LEVEL: 'warn',
    },
  })
  // The last lines of its output, quoted if it exits while starting.
  const output: string[] = []
  const keep = (line: string) => {
    const listening = LISTENING.exec(line)
    if (listening && url === undefined) url = `http://127.0.0.1:${listening[1]}`
    if (line !== '') output.push(line)
    output.splice(0, output.length - 20)
  }
  createInterface({ input: child.stdout! }).on('line', keep)
  createInterface({ input: child.stderr! }).on('line', keep)
  let exited = false
  const exit = new Promise<void>((resolve) =>
    child.on('exit', () => {
      exited = true
      resolve()
    }),
  )
  const stop = async () => {
    if (!exited) child.kill('SIGTERM')
    await exit
  }
  try {
    await waitFor(
      'the payments API to listen and its database to be ready',
      async () => {
        if (exited) throw new Error(`the payments API exited while starting:\n${output.join('\n')}`)
        if (url === undefined) return false
        const response = await fetch(`${url}/healthz`).catch(() => undefined)
        await response?.arrayBuffer()
        return response?.status === 200
      },
      60_000,
    )
  } catch (error) {
    await stop()
    throw error
  }
  return { url: url!, pid: child.pid!, stop }
}

/** Keys that carry their tenant (`t3.<prefix>-17`), so a replay goes to the tenant that created the key. */
const keyOf = (prefix: string, i: number) => `t${i % TENANTS}.${prefix}-${i}`
const headersFor = (key: string) => ({ authorization: `Bearer ${key.slice(0, key.indexOf('.'))}` })

/**
 * The mix, in blocks of four requests: a fresh key, a replay of a key the preceding first-execution run finished, the
 * fresh key again (a duplicate, often while the first copy still runs on another instance: 409 or a replay), and
 * another replay. Half the requests are replays, a quarter duplicates, a quarter first executions.
 */
function mixSequence(
  prefix: string,
  finished: readonly string[],
): { next: () => string; fresh: () => number } {
  let i = 0
  let fresh = 0
  return {
    next: () => {
      const slot = i % 4
      const block = i >> 2
      i++
      if (slot === 0) {
        fresh++
        return keyOf(prefix, block)
      }
      if (slot === 2) return keyOf(prefix, block)
      return finished[(block * 2 + (slot === 1 ? 0 : 1)) % finished.length]!
    },
    fresh: () => fresh,
  }
}

let runCounter = 0
const freshPrefix = (label: string) => `${label}-${process.pid}-${Date.now().toString(36)}-${runCounter++}`

interface PostgresCounters {
  commits: number
  walSyncs: number
  walBytes: number
}

async function postgresCounters(pool: pg.Pool): Promise<PostgresCounters> {
  const { rows } = await pool.query<{ commits: string; wal_sync: string; wal_bytes: string }>(
    `SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS commits,
       wal_sync, wal_bytes FROM pg_stat_wal`,
  )
  return {
    commits: Number(rows[0]!.commits),
    walSyncs: Number(rows[0]!.wal_sync),
    walBytes: Number(rows[0]!.wal_bytes),
  }
}

/**
 * CPU seconds so far of this database's backends and of the server's own background processes (WAL writer,
 * checkpointer, background writer, autovacuum), by pid: on a shared server, other databases' sessions are left out.
 */
async function postgresCpu(pool: pg.Pool): Promise<Map<number, number>> {
  const { rows } = await pool.query<{ pid: number }>(
    `SELECT pid FROM pg_stat_activity
     WHERE datname = current_database() OR backend_type IN ('walwriter', 'checkpointer', 'background writer',
       'autovacuum launcher', 'autovacuum worker')`,
  )
  return new Map(rows.map(({ pid }) => [pid, cpuSeconds(pid)]))
}

/** CPU seconds used between two readings; a backend that appeared meanwhile counts from its start. */
function postgresCpuBetween(before: Map<number, number>, after: Map<number, number>): number {
  let total = 0
  for (const [pid, seconds] of after) total += seconds - (before.get(pid) ?? 0)
  return total
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

interface Sample {
  rps: number
  p50: number
  p99: number
  statuses: Record<number, number>
  errors: number
  payments: number
  freshKeys: number
  busy: number
  iowait: number
  loadAverage: number
  instancesUs: number
  postgresUs: number
  loadUs: number
  commits: number
  walSyncs: number
  walBytes: number
}

/** One measured run of `requests` over the instances, with the CPU and Postgres counters read around it. */
async function measure(
  pool: pg.Pool,
  instances: readonly ApiInstance[],
  connections: number,
  requests: number,
  nextKey: () => string,
  prefix: string,
  freshKeys: () => number,
): Promise<Sample> {
  const counters0 = await postgresCounters(pool)
  const ticks0 = machineTicks()
  const instances0 = instances.reduce((sum, i) => sum + cpuSeconds(i.pid), 0)
  const postgres0 = await postgresCpu(pool)
  const load0 = process.cpuUsage()
  const result = await load({
    url: instances.map((i) => i.url),
    connections,
    amount: requests,
    path: '/v1/payments',
    body: PAYMENT_BODY,
    nextKey,
    headersFor,
  })
  const loadCpu = process.cpuUsage(load0)
  const instancesCpu = instances.reduce((sum, i) => sum + cpuSeconds(i.pid), 0) - instances0
  const postgresUsed = postgresCpuBetween(postgres0, await postgresCpu(pool))
  const ticks1 = machineTicks()
  const loadAverage = os.loadavg()[0]!
  await sleep(STATS_FLUSH_MS)
  const counters1 = await postgresCounters(pool)
  const { rows } = await pool.query<{ n: string }>(
    `SELECT count(*) AS n FROM payments WHERE idempotency_key LIKE '%.' || $1 || '-%'`,
    [prefix],
  )
  const n = result.requests
  const elapsed = ticks1.total - ticks0.total
  return {
    rps: result.rps,
    p50: result.p50,
    p99: result.p99,
    statuses: result.statuses,
    errors: result.errors,
    payments: Number(rows[0]!.n),
    freshKeys: freshKeys(),
    busy: (ticks1.busy - ticks0.busy) / elapsed,
    iowait: (ticks1.iowait - ticks0.iowait) / elapsed,
    loadAverage,
    instancesUs: (instancesCpu * 1e6) / n,
    postgresUs: (postgresUsed * 1e6) / n,
    loadUs: (loadCpu.user + loadCpu.system) / n,
    commits: (counters1.commits - counters0.commits) / n,
    walSyncs: (counters1.walSyncs - counters0.walSyncs) / n,
    walBytes: (counters1.walBytes - counters0.walBytes) / n,
  }
}

async function relationBytes(pool: pg.Pool, rows: number) {
  const { rows: sizes } = await pool.query<{ heap: string; indexes: string; total: string }>(
    `SELECT pg_relation_size($1) AS heap, pg_indexes_size($1) AS indexes, pg_total_relation_size($1) AS total`,
    [ONCELY_KEYS],
  )
  const heap = Number(sizes[0]!.heap)
  const indexes = Number(sizes[0]!.indexes)
  const total = Number(sizes[0]!.total)
  // What is neither heap nor index is the TOAST table and its index (bodies too large to keep inline).
  const perRow = (bytes: number) => Math.round(bytes / rows)
  return {
    heap: perRow(heap),
    indexes: perRow(indexes),
    toast: perRow(total - heap - indexes),
    total: perRow(total),
  }
}

/** The key table as the measured payments left it, then compacted; and the reaper on expired keys. */
async function sizeKeyTable(pool: pg.Pool, peakInsertRps: number, reaperRows: number): Promise<KeyTableSize> {
  const { rows } = await pool.query<{ n: string }>(`SELECT count(*) AS n FROM ${ONCELY_KEYS}`)
  const count = Number(rows[0]!.n)
  const asWritten = await relationBytes(pool, count)
  await pool.query(`VACUUM FULL ${ONCELY_KEYS}`)
  const compacted = await relationBytes(pool, count)
  const keysPerDay = peakInsertRps * 86_400
  const retentionDays = DEFAULT_RETENTION_MS / 86_400_000
  // Expired copies of the demo's own rows, so the reaper deletes rows of the size measured above.
  const reaper = await reaperThroughput(pool, reaperRows, { likeExisting: true })
  return {
    rows: count,
    asWritten,
    compacted,
    peakInsertRps,
    keysPerDay,
    retentionHours: DEFAULT_RETENTION_MS / 3_600_000,
    bytesAtRetention: {
      asWritten: keysPerDay * retentionDays * asWritten.total,
      compacted: keysPerDay * retentionDays * compacted.total,
    },
    reaper,
  }
}

export async function instancesBench(options: {
  /** Instance counts to measure, e.g. [1, 2, 4]. */
  counts: readonly number[]
  /** Total connections, dealt out over the instances (a multiple of every count keeps the shares even). */
  connections: number
  requests: number
  warmup: number
  rounds: number
  reservation?: 'lock' | 'row'
  /** Expired keys the reaper deletes for its timing. */
  reaperRows: number
  log: (line: string) => void
}): Promise<InstancesResult> {
  const reservation = options.reservation ?? 'lock'
  // A database of its own: the demo's tables and its key table, and nothing the other suites wrote.
  const db = await createTestDatabase('bench_instances', { max: 2 })
  try {
    const samples = new Map<string, Sample[]>()
    for (let round = 0; round < options.rounds; round++) {
      // Every count once per round, so drift on a shared machine spreads over all of them.
      for (const count of options.counts) {
        const instances = await Promise.all(
          Array.from({ length: count }, () => startInstance(db.url, reservation)),
        )
        try {
          const warm = freshPrefix('warm')
          let w = 0
          await load({
            url: instances.map((i) => i.url),
            connections: options.connections,
            amount: options.warmup,
            path: '/v1/payments',
            body: PAYMENT_BODY,
            nextKey: () => keyOf(warm, w++),
            headersFor,
          })
          const firstPrefix = freshPrefix('first')
          let f = 0
          const finished: string[] = []
          const first = await measure(
            db.pool,
            instances,
            options.connections,
            options.requests,
            () => {
              const key = keyOf(firstPrefix, f++)
              finished.push(key)
              return key
            },
            firstPrefix,
            () => f,
          )
          const mixPrefix = freshPrefix('mix')
          const sequence = mixSequence(mixPrefix, finished)
          const mix = await measure(
            db.pool,
            instances,
            options.connections,
            options.requests,
            sequence.next,
            mixPrefix,
            sequence.fresh,
          )
          for (const [workload, sample] of [
            ['first', first],
            ['mix', mix],
          ] as const) {
            const id = `${count}/${workload}`
            samples.set(id, [...(samples.get(id) ?? []), sample])
            options.log(
              `  round ${round + 1} ${count} instance(s) ${workload.padEnd(5)} ${sample.rps.toFixed(0)} req/s, p50 ${sample.p50.toFixed(2)} ms, p99 ${sample.p99.toFixed(2)} ms, machine ${(sample.busy * 100).toFixed(0)}% busy`,
            )
          }
        } finally {
          await Promise.all(instances.map((i) => i.stop()))
        }
      }
    }
    const runs: InstancesRun[] = []
    for (const count of options.counts) {
      for (const workload of ['first', 'mix'] as const) {
        const list = samples.get(`${count}/${workload}`) ?? []
        const statuses: Record<number, number> = {}
        for (const s of list)
          for (const [code, n] of Object.entries(s.statuses))
            statuses[Number(code)] = (statuses[Number(code)] ?? 0) + n
        const sum = (pick: (s: Sample) => number) => list.reduce((total, s) => total + pick(s), 0)
        const mid = (pick: (s: Sample) => number) => median(list.map(pick))
        runs.push({
          instances: count,
          workload,
          connections: options.connections,
          requests: options.requests,
          rps: mid((s) => s.rps),
          rpsRounds: list.map((s) => s.rps),
          p50Ms: mid((s) => s.p50),
          p99Ms: mid((s) => s.p99),
          statuses,
          errors: sum((s) => s.errors),
          paymentsPerFreshKey: sum((s) => s.payments) / sum((s) => s.freshKeys),
          machineBusy: mid((s) => s.busy),
          machineIowait: mid((s) => s.iowait),
          loadAverage: mid((s) => s.loadAverage),
          instancesUs: mid((s) => s.instancesUs),
          postgresUs: mid((s) => s.postgresUs),
          loadUs: mid((s) => s.loadUs),
          commitsPerRequest: mid((s) => s.commits),
          walSyncsPerRequest: mid((s) => s.walSyncs),
          walBytesPerRequest: mid((s) => s.walBytes),
        })
      }
    }
    const peakInsertRps = Math.max(...runs.filter((r) => r.workload === 'first').map((r) => r.rps))
    options.log('\ninstances: key table size, then the reaper')
    const keyTable = await sizeKeyTable(db.pool, peakInsertRps, options.reaperRows)
    return { reservation, rounds: options.rounds, runs, keyTable }
  } finally {
    await db.drop()
  }
}
