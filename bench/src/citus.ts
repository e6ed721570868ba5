// `pnpm --filter @oncely/bench citus [-- --quick]`: the engine on one Postgres against the engine through a Citus
// coordinator, in one run on one machine, and what adding a worker changes. Prints Markdown tables (docs/scaling.md).
//
// One cluster of Debian's PostgreSQL 15 with Citus (scripts/citus-cluster.mjs), durable (fsync on, synchronous
// commit): a coordinator and three workers, of which the database first uses two. "One Postgres" is a database on
// the coordinator without Citus: the same server, binary and settings. Each request is what the demo's payment route
// does to the database: a reservation, a payment row, an outbox row and the finished key record, for one of 8
// tenants; the replay cache is off, so a replay is the database's answer. Load: `concurrency` requests in flight,
// from this process (the engine runs here too). Targets alternate within each round, so drift spreads over them.
import { randomUUID } from 'node:crypto'
import { readdirSync, readFileSync } from 'node:fs'
import os from 'node:os'
import { performance } from 'node:perf_hooks'
import { parseArgs } from 'node:util'
import { createEngine, distribute, type Engine, migrate, postgresStore } from '@oncely/server'
import { enqueue } from '@oncely/server/outbox'
import { createCitusTestDatabase, requireCitus, startCitusCluster, withDatabase } from '@oncely/test-support'
import pg from 'pg'
import { machineTicks } from './proc.js'
import { median, percentile } from './stats.js'

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    requests: { type: 'string' },
    rounds: { type: 'string' },
    concurrency: { type: 'string', default: '16' },
    shards: { type: 'string', default: '32' },
  },
})
const requests = Number(values.requests ?? (values.quick ? 1_000 : 3_000))
const rounds = Number(values.rounds ?? (values.quick ? 2 : 3))
const concurrency = Number(values.concurrency)
const shardCount = Number(values.shards)
const log = (line: string) => console.error(line)
if (!requireCitus('the Citus bench')) process.exit(0)

const TENANTS = Array.from({ length: 8 }, (_, i) => `t${i}`)
const PROTOCOLS = ['lock', 'row'] as const
type Protocol = (typeof PROTOCOLS)[number]

interface Target {
  name: string
  pool: pg.Pool
  /** Node URLs of the target's database (for commit counts), and the postmaster pids whose CPU is its. */
  nodes: { name: string; url: string; pid: number }[]
}

const CLOCK_TICKS = 100
/**
 * CPU seconds of a postmaster and every process it forked (backends, background workers), the ones that exited
 * included: the postmaster waits for each, so the kernel adds their time to its children's (cutime, cstime).
 */
function serverSeconds(postmaster: number): number {
  let ticks = 0
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    try {
      const fields = readFileSync(`/proc/${entry}/stat`, 'utf8').split(') ')[1]!.split(' ')
      if (Number(entry) === postmaster)
        ticks += Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14])
      else if (Number(fields[1]) === postmaster) ticks += Number(fields[11]) + Number(fields[12])
    } catch {
      // gone
    }
  }
  return ticks / CLOCK_TICKS
}

// COMMITs the engine sends (alone or at the end of a message with other statements), counted in this process.
let commitsSent = 0
const query = pg.Client.prototype.query
pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
  const [first] = args
  const text = typeof first === 'string' ? first : (first as { text?: string } | undefined)?.text
  if (text) commitsSent += text.match(/\bCOMMIT\b/g)?.length ?? 0
  return (query as (...a: unknown[]) => unknown).apply(this, args)
} as typeof query

async function businessTables(pool: pg.Pool, distributed: boolean) {
  await migrate(pool)
  await pool.query(`CREATE TABLE payments (id bigserial, tenant text NOT NULL, cart text NOT NULL,
    amount integer NOT NULL, PRIMARY KEY (tenant, id))`)
  if (!distributed) return
  await pool.query(`SELECT create_distributed_table('payments', 'tenant', shard_count => ${shardCount})`)
  await distribute(pool, { colocateWith: 'payments' })
}

function engineOn(pool: pg.Pool, reservation: Protocol): Engine {
  return createEngine({ store: postgresStore({ pool }), reservation, replayCache: false })
}

const request = (key: string) => {
  const tenant = TENANTS[Number.parseInt(key.slice(0, 2), 16) % TENANTS.length]!
  return {
    scope: tenant,
    operation: 'POST /v1/payments',
    key,
    fingerprint: 'f',
    handler: async (ctx: { tx: pg.PoolClient; scope: string }) => {
      await ctx.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 1250)', [
        ctx.scope,
        key,
      ])
      await enqueue(ctx.tx, { topic: 'payments.created', payload: { key }, scope: ctx.scope })
      return { status: 201, body: { key } }
    },
  }
}

/** `keys.length` executions, `concurrency` at a time; latencies in ms. */
async function drive(engine: Engine, keys: string[], expect: 'executed' | 'replayed') {
  const latencies: number[] = []
  let next = 0
  let wrong = 0
  const started = performance.now()
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < keys.length) {
        const key = keys[next++]!
        const t = performance.now()
        const outcome = await engine.execute(request(key))
        latencies.push(performance.now() - t)
        if (outcome.kind !== expect) wrong++
      }
    }),
  )
  return { rps: keys.length / ((performance.now() - started) / 1000), latencies, wrong }
}

interface Sample {
  rps: number
  p50: number
  p99: number
  busy: number
  wrong: number
  commits: number
  cpu: Record<string, number>
  app: number
}

/** One timed run of a workload on a target, with what it cost per request. */
async function measure(target: Target, protocol: Protocol, keys: string[], workload: 'first' | 'replay') {
  const engine = engineOn(target.pool, protocol)
  const commits0 = commitsSent
  const cpu0 = target.nodes.map((n) => serverSeconds(n.pid))
  const app0 = process.cpuUsage()
  const ticks0 = machineTicks()
  const run = await drive(engine, keys, workload === 'first' ? 'executed' : 'replayed')
  const ticks1 = machineTicks()
  const app1 = process.cpuUsage(app0)
  const cpu = Object.fromEntries(
    target.nodes.map((n, i) => [n.name, ((serverSeconds(n.pid) - cpu0[i]!) * 1e6) / keys.length]),
  )
  const sample: Sample = {
    rps: run.rps,
    p50: percentile(run.latencies, 50),
    p99: percentile(run.latencies, 99),
    busy: (ticks1.busy - ticks0.busy) / (ticks1.total - ticks0.total),
    wrong: run.wrong,
    commits: (commitsSent - commits0) / keys.length,
    cpu,
    app: (app1.user + app1.system) / keys.length,
  }
  return sample
}

/** Commands the coordinator sends to workers per request, and two-phase commits, from 50 logged requests. */
async function remoteCost(target: Target, protocol: Protocol, workload: 'first' | 'replay') {
  const commands: string[] = []
  const pool = new pg.Pool({
    connectionString: target.nodes[0]!.url,
    max: 4,
    options: '-c citus.log_remote_commands=on',
  })
  pool.on('connect', (client) =>
    client.on('notice', (n: { message?: string }) => {
      const command = /^issuing (.*)$/s.exec(n.message ?? '')?.[1]
      if (command) commands.push(command)
    }),
  )
  const engine = engineOn(pool, protocol)
  // Warm up (connections, prepared statements), then log 50 first executions or 50 replays of the warm-up's keys.
  const warm = Array.from({ length: 50 }, () => randomUUID())
  await drive(engine, warm, 'executed')
  commands.length = 0
  const keys = workload === 'first' ? warm.map(() => randomUUID()) : warm
  await drive(engine, keys, workload === 'first' ? 'executed' : 'replayed')
  await pool.end()
  const per = (predicate: (c: string) => boolean) => commands.filter(predicate).length / keys.length
  return { commands: per(() => true), twoPhase: per((c) => c.startsWith('PREPARE TRANSACTION')) }
}

const cluster = await startCitusCluster({
  workers: 3,
  // Durable, and logical WAL so the rebalance moves shards online (what a production cluster would do).
  settings: ['fsync=on', 'full_page_writes=on', 'synchronous_commit=on', 'wal_level=logical'],
})
const started = new Date().toISOString()
const load0 = os.loadavg()[0]!
try {
  const coordinator = cluster.nodes[0]!
  const pidOf = (name: string) => cluster.nodes.find((n) => n.name === name)!.pid
  // One Postgres: a database on the coordinator with no Citus in it.
  const admin = new pg.Client({ connectionString: cluster.url })
  await admin.connect()
  await admin.query('CREATE DATABASE bench_single TEMPLATE template0')
  await admin.end()
  const single: Target = {
    name: 'one Postgres',
    pool: new pg.Pool({ connectionString: withDatabase(cluster.url, 'bench_single'), max: 20 }),
    nodes: [{ name: 'coordinator', url: withDatabase(cluster.url, 'bench_single'), pid: coordinator.pid }],
  }
  await businessTables(single.pool, false)
  const db = await createCitusTestDatabase('bench_citus', {
    cluster: cluster.url,
    workers: 2,
    pool: { max: 20 },
  })
  await businessTables(db.pool, true)
  const citus = (workers: number): Target => ({
    name: `Citus, ${workers} workers`,
    pool: db.pool,
    nodes: db.nodeUrls.slice(0, workers + 1).map((n) => ({ ...n, pid: pidOf(n.name) })),
  })

  const results = new Map<string, Sample[]>()
  const costs = new Map<string, { commands: number; twoPhase: number }>()
  const runTargets = async (targets: Target[]) => {
    // Warm-up: connections opened, statements prepared, caches filled.
    for (const protocol of PROTOCOLS)
      for (const target of targets)
        await drive(
          engineOn(target.pool, protocol),
          Array.from({ length: 200 }, () => randomUUID()),
          'executed',
        )
    for (let round = 0; round < rounds; round++)
      for (const protocol of PROTOCOLS)
        for (const target of targets) {
          const keys = Array.from({ length: requests }, () => randomUUID())
          for (const workload of ['first', 'replay'] as const) {
            const sample = await measure(target, protocol, keys, workload)
            const id = `${target.name}|${protocol}|${workload}`
            results.set(id, [...(results.get(id) ?? []), sample])
            log(
              `round ${round + 1} ${id}: ${sample.rps.toFixed(0)} req/s, p50 ${sample.p50.toFixed(2)} ms, ${sample.commits.toFixed(2)} commits/request${sample.wrong ? `, ${sample.wrong} WRONG` : ''}`,
            )
          }
        }
    for (const target of targets.filter((t) => t.nodes.length > 1))
      for (const protocol of PROTOCOLS)
        for (const workload of ['first', 'replay'] as const)
          costs.set(`${target.name}|${protocol}|${workload}`, await remoteCost(target, protocol, workload))
  }
  await runTargets([single, citus(2)])

  // Adding a worker: the database is told of the third one, and its shards are rebalanced onto it.
  const worker3 = cluster.nodes[3]!
  const client = new pg.Client({ connectionString: worker3.url })
  await client.connect()
  await client.query(`CREATE DATABASE "${db.name}" TEMPLATE template0`)
  await client.end()
  const w3 = new pg.Client({ connectionString: withDatabase(worker3.url, db.name) })
  await w3.connect()
  await w3.query('CREATE EXTENSION citus')
  await w3.end()
  db.nodeUrls.push({ name: 'worker3', url: withDatabase(worker3.url, db.name) })
  await db.pool.query('SELECT citus_add_node($1, $2)', ['127.0.0.1', worker3.port])
  const keyRows = (await db.pool.query('SELECT count(*)::int AS n FROM oncely.idempotency_keys')).rows[0].n
  const rebalanceStarted = performance.now()
  await db.pool.query(`SELECT rebalance_table_shards(shard_transfer_mode => 'force_logical')`)
  const rebalanceMs = performance.now() - rebalanceStarted
  const moved = await db.pool.query(
    `SELECT nodeport, count(*)::int AS shards FROM citus_shards
     WHERE table_name = 'oncely.idempotency_keys'::regclass GROUP BY 1 ORDER BY 1`,
  )
  log(
    `rebalance: ${rebalanceMs.toFixed(0)} ms for ${keyRows} key rows; shards per worker ${moved.rows.map((r) => r.shards).join(', ')}`,
  )
  await runTargets([citus(3)])

  // The tables.
  const nodesOf = (name: string) =>
    name === 'one Postgres' ? ['coordinator'] : ['coordinator', 'worker1', 'worker2', 'worker3']
  const lines: string[] = []
  lines.push(
    `Run: ${started}, ${os.cpus()[0]?.model.trim()} x ${os.availableParallelism()}, load average ${load0.toFixed(2)} at start; ${rounds} rounds of ${requests} requests per target, protocol and workload, ${concurrency} in flight; ${shardCount} shards; durable (fsync on, synchronous_commit on); rebalanced with logical replication.`,
    '',
    '| target | protocol | workload | req/s | req/s per round | p50 ms | p99 ms | commits sent/request | commands to workers/request | two-phase commits/request | machine CPU busy | CPU us/request: engine process | coordinator | workers |',
    '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |',
  )
  for (const [id, samples] of results) {
    const [target, protocol, workload] = id.split('|') as [string, string, string]
    const cost = costs.get(id)
    const m = (f: (s: Sample) => number) => median(samples.map(f))
    const workers = nodesOf(target)
      .slice(1)
      .reduce((sum, n) => sum + m((s) => s.cpu[n] ?? 0), 0)
    lines.push(
      `| ${target} | ${protocol} | ${workload} | ${m((s) => s.rps).toFixed(0)} | ${samples.map((s) => s.rps.toFixed(0)).join(', ')} | ${m((s) => s.p50).toFixed(2)} | ${m((s) => s.p99).toFixed(2)} | ${m((s) => s.commits).toFixed(2)} | ${cost ? cost.commands.toFixed(1) : '-'} | ${cost ? cost.twoPhase.toFixed(2) : '-'} | ${(m((s) => s.busy) * 100).toFixed(0)}% | ${m((s) => s.app).toFixed(0)} | ${m((s) => s.cpu.coordinator ?? 0).toFixed(0)} | ${target === 'one Postgres' ? '-' : workers.toFixed(0)} |`,
    )
    if (samples.some((s) => s.wrong > 0))
      lines.push(`(${id}: ${samples.reduce((n, s) => n + s.wrong, 0)} wrong answers)`)
  }
  lines.push(
    '',
    `Adding a worker: citus_add_node, then rebalance_table_shards() moved the shards (${keyRows} key rows, with the payments and outbox rows co-located with them) in ${(rebalanceMs / 1000).toFixed(1)} s; key-table shards per worker after it: ${moved.rows.map((r) => r.shards).join(', ')}.`,
  )
  console.log(lines.join('\n'))
  await single.pool.end()
  await db.drop()
} finally {
  await cluster.stop()
}
