/**
 * The driver: owns the seed, builds the topology (Postgres, API instances behind fault proxies, client workers),
 * feeds the generator's intents to the workers, runs the nemesis, heals, drains, reads the ledger, checks it and
 * reports. docs/chaos.md describes the model.
 */
import { mkdirSync, rmSync, writeFileSync } from 'node:fs'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import {
  type CitusCluster,
  type CitusTestDatabase,
  createCitusTestDatabase,
  createTestDatabase,
  type PgBouncer,
  startCitusCluster,
  startPgBouncer,
  type TestDatabase,
} from '@oncely/test-support'
import pg from 'pg'
import { check, FAILOVER_MARGIN_MS } from './checker.js'
import { type Command, dispatch, PROBE_FAULTS, type ProbeIntentKind, type Readiness } from './dispatch.js'
import { NETWORK_FAULTS, SERVER_CRASH_POINTS, WORKER_CRASH_POINTS } from './faults.js'
import { needsExpiredKey, type PlannedIntent, planBurst, planIntents } from './generator.js'
import { startHealthMonitor } from './health-monitor.js'
import { HistoryWriter, type NewEvent, type ReportedEvent } from './history.js'
import { IntentTracker } from './in-flight.js'
import { startNemesis } from './nemesis.js'
import type { ChaosOptions } from './options.js'
import { injectedFaults, overtime, PROBE_KINDS } from './overtime.js'
import { ManagedProcess } from './processes.js'
import { FaultProxy, type ProxyFault } from './proxy.js'
import { createRandom } from './random.js'
import { ReplicatedCluster } from './replication.js'
import { buildReport, type ChaosReport, writeReport } from './report.js'
import { crashRotation } from './rotation.js'
import { saturate, sendBurst } from './saturation.js'
import { keysInProgress, settle, waitFor } from './settle.js'
import { dump, readFinalDb } from './snapshot.js'

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../..')
const NODE_ARGS = ['--conditions=@oncely/source', '--import', 'tsx']
/** The client's attempt timeout; the proxy's `delay` exceeds it and a pause exceeds the lease. */
const CLIENT_TIMEOUT_MS = 2000
const LEASE_MS = 2000
/** How long stall-server holds a live handler: past its lease, so another instance takes the key over. */
const STALL_MS = LEASE_MS + 1500
const DRAIN_ROUNDS = 3
/** How long an API instance (listening, and its database answering) or a client worker may take to be ready. */
const SERVER_READY_MS = 180_000

/** How often workers re-drive their pending intents during the fault phase. */
const RESUME_EVERY_MS = 5000
/**
 * How long a failover holds the standby back before it crashes the primary: at least the first, at most the second,
 * ending early once this many intents were acknowledged meanwhile (under async replication those are the commits the
 * failover loses; under sync, commits wait for the standby and nothing is acknowledged but replays).
 */
const FAILOVER_LAG_MS = [2000, 5000] as const
const FAILOVER_LAG_ACKS = 3
/** At most this many intents acknowledged around a failover are sent again after it (`failover-replay`). */
const FAILOVER_REPLAYS = 10
/**
 * The pooler's server connections per database. Requests hold a business transaction while their charge step takes
 * another (the demo's two pools), and both go through this one pool: it must exceed what the instances can hold
 * open at once, or they all wait for a connection none of them releases.
 */
const POOLER_POOL_SIZE = 40
/**
 * The API's own pool (`DATABASE_POOL_SIZE`): small, so a burst of a few times as many requests fills it, as a busy
 * production pool is filled, and an attempt that waits for a second connection while it holds one shows.
 */
const API_POOL_SIZE = 5
/** Requests per pool-saturating burst. */
const BURST_SIZE = 4 * API_POOL_SIZE
/** When, after a burst starts, the API's database connections are terminated (while the burst holds them). */
const BURST_KILLS_MS = [300, 1500] as const
/**
 * How long a request sent straight to an instance (a burst's, a health probe) may wait for its answer. Far above what
 * the faults hold a request for (a pause of 3 s, a stall of 3.5 s, a slow card of 3 s queued behind a burst) and what
 * a loaded machine adds (the slowest answer seen with the machine's load at 25 on 2 cores: 22 s); a deadlocked pool
 * answers never.
 */
const LIVENESS_BOUND_MS = 60_000
/** How long the final settling waits for the intents still in flight. */
const SETTLE_TIMEOUT_MS = 120_000
/** What the demo prints once it listens, with the port it bound (it is started with PORT=0). */
const LISTENING = /^payments-api: listening at http:\/\/127\.0\.0\.1:(\d+)\//

export async function run(
  options: ChaosOptions,
  log: (line: string) => void = console.log,
): Promise<ChaosReport> {
  const startedAt = new Date()
  mkdirSync(options.runDir, { recursive: true })
  const logDir = join(options.runDir, 'logs')
  const history = new HistoryWriter(join(options.runDir, 'history.jsonl'))
  const random = createRandom(options.seed)
  const enabled = new Set<string>(options.faults)
  // Every event also tells the tracker where each intent stands, so the drain can wait for all of them.
  const tracker = new IntentTracker()
  const append = (event: NewEvent) => tracker.observe(history.append(event))
  const record = (process: string, event: ReportedEvent) => append({ ...event, process } as NewEvent)
  const fault = (process: string, name: string, target: string, phase: 'start' | 'stop' | 'once' = 'once') =>
    record(process, { type: 'fault', fault: name, target, phase })
  let shuttingDown = false
  let healed = false
  let draining = false

  // Restarting Postgres or failing it over needs a cluster of our own; otherwise the shared one named by
  // DATABASE_URL is used. The simulated provider is another system: it keeps its charges on the shared server
  // whatever happens to the run's database.
  const cleanup: Array<() => Promise<unknown>> = []
  const sharedUrl = process.env.DATABASE_URL
  let cluster: ReplicatedCluster | undefined
  const pgdata = join(options.runDir, 'pgdata')
  let passed = false
  if (enabled.has('restart-db') || enabled.has('failover')) {
    cluster = await ReplicatedCluster.start({
      dir: pgdata,
      logDir,
      replication: options.replication,
      standby: enabled.has('failover'),
      log,
    })
    process.env.DATABASE_URL = cluster.url
  }
  // On Citus: a coordinator and two workers of the run's own, the demo's tables distributed by tenant at its start.
  // Durable as production runs it (a test cluster is not by default): restart-worker crashes a worker with an
  // immediate shutdown, and with synchronous_commit off that would lose commits the API had already acknowledged.
  const citus: CitusCluster | undefined =
    options.database === 'citus'
      ? await startCitusCluster({ settings: ['fsync=on', 'synchronous_commit=on', 'full_page_writes=on'] })
      : undefined
  // Ctrl-C or a CI timeout: stop every process this run started before exiting, so nothing is left behind.
  const onSignal = () => {
    shuttingDown = true
    void Promise.allSettled([...cleanup.map((fn) => fn()), cluster?.dispose(), citus?.stop()]).finally(() =>
      process.exit(130),
    )
  }
  process.once('SIGINT', onSignal)
  process.once('SIGTERM', onSignal)
  const db: TestDatabase | CitusTestDatabase = citus
    ? await createCitusTestDatabase('chaos', { cluster: citus.url })
    : await createTestDatabase('chaos').finally(() => {
        if (sharedUrl === undefined) delete process.env.DATABASE_URL
        else process.env.DATABASE_URL = sharedUrl
      })
  const provider = await createTestDatabase('chaos_provider')
  cleanup.push(() => provider.drop())
  let bouncer: PgBouncer | undefined
  try {
    const dbUrl = new URL(db.url)
    if (options.pooler === 'pgbouncer') {
      bouncer = await startPgBouncer({
        target: db.url,
        poolSize: POOLER_POOL_SIZE,
        // Back in a second after Postgres restarts or fails over (the default waits 15 s between login attempts).
        settings: { server_login_retry: 1 },
      })
      cleanup.push(() => bouncer!.stop())
    }
    const dbProxy = await FaultProxy.start({
      name: 'proxy-db',
      protocol: 'tcp',
      upstream: { host: '127.0.0.1', port: bouncer?.port ?? Number(dbUrl.port || 5432) },
      random: random.fork('proxy-db'),
    })
    cleanup.push(() => dbProxy.close())
    const proxiedDbUrl = new URL(db.url)
    proxiedDbUrl.hostname = '127.0.0.1'
    proxiedDbUrl.port = String(dbProxy.port)

    // API instances, each restarted by this supervisor when a crash point kills it. Every incarnation gets a fresh
    // seed (the same seed would crash at the same request again) and the next crash point of a seeded rotation,
    // so each point is hit early in the run.
    const serverRandom = random.fork('servers')
    const armServer = crashRotation(
      serverRandom,
      SERVER_CRASH_POINTS.filter((point) => enabled.has(`crash-${point}`)),
      { firstPass: SERVER_CRASH_POINTS.length * options.servers, firstRate: 0.25 },
    )
    // A server keeps its arm until that point fires: restarts for other reasons (Postgres down at boot) must not
    // skip points.
    const arms = new Map<number, { point: string; rate: number; fired: boolean }>()
    const crashEnv = (i: number): Record<string, string> => {
      if (healed) return { ONCELY_CRASH_AT: '' }
      let arm = arms.get(i)
      if (!arm || arm.fired) {
        const next = armServer()
        if (!next) return { ONCELY_CRASH_AT: '' }
        arm = { ...next, fired: false }
        arms.set(i, arm)
      }
      return { ONCELY_CRASH_AT: arm.point, ONCELY_CRASH_RATE: String(arm.rate) }
    }
    // stall-server is a per-request draw inside the demo, so a run could miss it: one instance, picked from the
    // seed, stalls every request until the first stall is seen, then is restarted gracefully once that stall has
    // played out; every other incarnation stalls 10% of its requests.
    const stallServer = random.fork('stall').int(0, options.servers - 1)
    let stallSeen = false
    const forcedStall = new Set<number>()
    const stallEnv = (i: number): Record<string, string> => {
      if (!enabled.has('stall-server') || healed) return {}
      const forced = !stallSeen && i === stallServer
      if (forced) forcedStall.add(i)
      else forcedStall.delete(i)
      return {
        ONCELY_DELAY_AT: 'after-provider',
        ONCELY_DELAY_MS: String(STALL_MS),
        ONCELY_DELAY_RATE: forced ? '1' : '0.1',
      }
    }
    const servers: ManagedProcess[] = []
    const supervised = new Set<ManagedProcess>()
    const paused = new Set<number>()
    const proxies: FaultProxy[] = []
    /**
     * Points each instance's proxy at it (at the next instance while it is paused), and its duplicates at the next
     * one. Every incarnation binds a port of its own (PORT=0), so this runs after every start; an instance that is
     * down keeps its last address until it is back (its connections are refused meanwhile, as before a restart).
     */
    const route = () => {
      for (const [j, proxy] of proxies.entries()) {
        const next = servers[(j + 1) % servers.length]!.port
        const own = paused.has(j) ? next : servers[j]!.port
        if (own !== undefined) proxy.retarget({ port: own }, next === undefined ? undefined : { port: next })
      }
    }
    for (let i = 0; i < options.servers; i++) {
      const name = `api-${i + 1}`
      const server: ManagedProcess = new ManagedProcess({
        name,
        args: [...NODE_ARGS, 'src/main.ts'],
        cwd: join(ROOT, 'apps/payments-api'),
        logDir,
        ready: { port: LISTENING, healthPath: '/healthz' },
        // An instance is ready once its database answers: on a loaded machine, after a restart of Postgres or a
        // failover, that takes longer than the default 30 s, and the run must wait rather than give up.
        readyTimeoutMs: SERVER_READY_MS,
        env: () => ({
          PORT: '0',
          HOST: '127.0.0.1',
          DATABASE_URL: proxiedDbUrl.toString(),
          DATABASE_POOL_SIZE: String(API_POOL_SIZE),
          ...(bouncer ? { DATABASE_POOLER: 'transaction' } : {}),
          ...(citus ? { DATABASE_DISTRIBUTION: 'citus' } : {}),
          PROVIDER_DATABASE_URL: provider.url,
          LOG_LEVEL: 'warn',
          ONCELY_LEASE_MS: String(LEASE_MS),
          ONCELY_RETENTION_MS: String(options.retentionMs),
          ONCELY_PROVIDER_FAILURE_RATE: healed ? '0' : '0.03',
          // A provider that takes time keeps requests in flight, so a pause is likely to catch one mid-protocol.
          ONCELY_PROVIDER_DELAY_MS: healed ? '0' : '100',
          ONCELY_CHAOS: '1',
          ONCELY_CHAOS_SEED: String(serverRandom.int(0, 0xffff_ffff)),
          ...crashEnv(i),
          // A handler stalled past its lease while alive (a GC pause, a slow disk): the other fencing case.
          ...stallEnv(i),
          ...(options.idempotency ? {} : { ONCELY_UNSAFE_DISABLE_IDEMPOTENCY: '1' }),
          ...(options.fencing ? {} : { ONCELY_UNSAFE_DISABLE_FENCING: '1' }),
          ...(options.backstop ? {} : { ONCELY_UNSAFE_DISABLE_BACKSTOP: '1' }),
          ONCELY_RESERVATION: options.reservation,
          ONCELY_REPLAY_CACHE: options.replayCache ? '1' : '0',
        }),
        onLine: (line) => {
          // As soon as it listens (it answers 503 while it waits for its database), not once it is ready: a client
          // meanwhile gets a 503 with Retry-After, as from a restarting instance on a fixed port, not a refusal.
          if (LISTENING.test(line)) route()
          const crash = /^ONCELY_CHAOS crash (\S+)/.exec(line)
          if (crash) {
            fault(name, `crash-${crash[1]}`, name)
            const arm = arms.get(i)
            if (arm) arm.fired = true
          }
          if (/^ONCELY_CHAOS delay /.test(line)) {
            fault(name, 'stall-server', name)
            if (forcedStall.delete(i)) {
              stallSeen = true
              const pid = server.pid
              setTimeout(() => {
                if (!shuttingDown && !healed && !paused.has(i) && server.pid === pid) void server.stop()
              }, STALL_MS + 1000)
            }
          }
        },
        onExit: ({ code, signal, pid }) => {
          record(name, { type: 'process', action: 'exit', pid, code, signal })
          if (!shuttingDown && supervised.has(server)) void restart(server)
        },
      })
      servers.push(server)
      supervised.add(server)
    }
    const restart = async (p: ManagedProcess) => {
      await new Promise((r) => setTimeout(r, 200))
      if (shuttingDown || p.running) return
      await p.start().catch((error) => log(`restart of ${p.name} failed: ${(error as Error).message}`))
      if (p.pid) record(p.name, { type: 'process', action: 'ready', pid: p.pid })
      route()
    }
    cleanup.push(async () => Promise.all(servers.map((s) => s.dispose())))
    // One at a time: the first runs the migrations, the others find them done.
    for (const server of servers) {
      await server.start()
      record(server.name, { type: 'process', action: 'ready', pid: server.pid! })
    }
    // Liveness: every instance's /healthz, straight to it, from now until the ledger is read.
    const health = startHealthMonitor({
      instances: () => servers.map((s) => ({ name: s.name, pid: s.pid, port: s.port })),
      record: append,
      boundMs: LIVENESS_BOUND_MS,
    })
    cleanup.push(() => health.stop())

    // A fault proxy in front of each instance; duplicates go to the next instance.
    for (let i = 0; i < options.servers; i++) {
      const name = `proxy-api-${i + 1}`
      const proxyRandom = random.fork(name)
      const rates: Partial<Record<ProxyFault, number>> = {}
      for (const kind of NETWORK_FAULTS) {
        if (enabled.has(kind)) rates[kind] = kind === 'black-hole' ? 0.005 : 0.01 + proxyRandom.next() * 0.04
      }
      const proxy = await FaultProxy.start({
        name,
        upstream: { port: servers[i]!.port! },
        duplicateTo: { port: servers[(i + 1) % servers.length]!.port! },
        random: proxyRandom,
        rates,
        delayMs: CLIENT_TIMEOUT_MS + 1000,
        onFault: (e) => fault(name, e.fault, `${name}#${e.connection}`),
      })
      // Each enabled kind at least once, early, so short runs still count every kind.
      proxy.force(...NETWORK_FAULTS.filter((kind) => enabled.has(kind)))
      proxies.push(proxy)
      cleanup.push(() => proxy.close())
    }

    // Client workers; one tenant each; restarted and resumed after a crash point kills them.
    const keys = new Map<string, string>()
    /** When each intent first settled (ok or fail), by the driver's clock. */
    const settledAt = new Map<string, number>()
    /** When each intent was first acknowledged as created (2xx). */
    const createdAt = new Map<string, number>()
    const answered = new Set<string>()
    const drained = new Map<string, string[]>()
    const workerRandom = random.fork('workers')
    const armWorker = crashRotation(
      workerRandom,
      WORKER_CRASH_POINTS.filter((point) => enabled.has(`kill-worker-${point}`)),
      { firstPass: WORKER_CRASH_POINTS.length * options.workers, firstRate: 0.15, laterRate: 0.01 },
    )
    const workerCrashEnv = (): Record<string, string> => {
      const armed = healed ? undefined : armWorker()
      return armed
        ? { ONCELY_CHAOS_WORKER_CRASH_AT: armed.point, ONCELY_CHAOS_WORKER_CRASH_RATE: String(armed.rate) }
        : { ONCELY_CHAOS_WORKER_CRASH_AT: '' }
    }
    const workers: ManagedProcess[] = []
    for (let w = 0; w < options.workers; w++) {
      const name = `worker-${w + 1}`
      const worker: ManagedProcess = new ManagedProcess({
        name,
        args: [...NODE_ARGS, 'src/worker.ts'],
        cwd: join(ROOT, 'test/chaos'),
        logDir,
        ready: { line: /^\{"type":"ready"\}$/ },
        // A worker is ready once tsx compiled it and its store opened: over 30 s at load 50 on 2 cores.
        readyTimeoutMs: SERVER_READY_MS,
        env: () => ({
          ONCELY_CHAOS_WORKER_NAME: name,
          ONCELY_CHAOS_BASE_URL: `http://127.0.0.1:${proxies[w % proxies.length]!.port}`,
          ONCELY_CHAOS_TENANT: `tenant-${w + 1}`,
          ONCELY_CHAOS_STORE_DIR: join(options.runDir, 'stores', name),
          ONCELY_CHAOS_TIMEOUT_MS: String(CLIENT_TIMEOUT_MS),
          ONCELY_CHAOS_SEED: String(workerRandom.int(0, 0xffff_ffff)),
          ...workerCrashEnv(),
        }),
        onLine: (line, stream) => {
          if (stream !== 'stdout' || !line.startsWith('{')) return
          const event = JSON.parse(line) as ReportedEvent | { type: 'ready' }
          if (event.type === 'ready') return
          if (event.type === 'drain') drained.set(name, event.pending)
          if ((event.type === 'attempt' || event.type === 'intent') && event.key)
            keys.set(event.intent, event.key)
          if (event.type === 'intent' && (event.phase === 'ok' || event.phase === 'fail'))
            if (!settledAt.has(event.intent)) settledAt.set(event.intent, Date.now())
          if (event.type === 'intent' && event.phase === 'ok' && !createdAt.has(event.intent))
            createdAt.set(event.intent, Date.now())
          if (event.type === 'intent' && event.phase !== 'invoke') answered.add(event.intent)
          record(name, event)
        },
        onExit: ({ code, signal, pid }) => {
          record(name, { type: 'process', action: 'exit', pid, code, signal })
          tracker.processExited(name)
          if (shuttingDown) return
          void restart(worker).then(() =>
            worker.send(JSON.stringify({ type: draining ? 'drain' : 'resume' })),
          )
        },
      })
      workers.push(worker)
      await worker.start()
      record(name, { type: 'process', action: 'ready', pid: worker.pid! })
    }
    cleanup.push(async () => Promise.all(workers.map((w) => w.dispose())))

    // The nemesis, and the generator's intents spread over most of the fault phase.
    const plan = planIntents(random.fork('generator'), {
      intents: options.intents,
      workers: options.workers,
      changedPayloadRate: enabled.has('changed-payload') ? 0.05 : 0,
      reorderedRate: enabled.has('reordered-payload') ? 0.05 : 0,
      expiredReplayRate: enabled.has('expired-replay') ? 0.03 : 0,
      expiredChangedPayloadRate: enabled.has('expired-changed-payload') ? 0.01 : 0,
    })
    const planned = new Map(plan.map((intent) => [intent.id, intent]))
    /** What each raw intent (a probe, a failover replay, a burst) was sent as, to send it again at the end. */
    const raw = new Map<
      string,
      { worker: number; command: Extract<Command, { type: 'probe' }> } | PlannedIntent
    >()
    const sendProbe = (worker: number, command: Extract<Command, { type: 'probe' }>) => {
      raw.set(command.intent, { worker, command })
      return workers[worker]!.send(JSON.stringify(command))
    }
    let replays = 0
    /**
     * After a failover, the intents acknowledged from shortly before it began go again with their key and body, as a
     * client whose answer got lost would: each must get its stored answer (the key and its payment survived
     * together) or, where the failover lost both, run again and get the charge the provider already took.
     */
    const replayAfterFailover = (since: number) => {
      const recent = [...createdAt].filter(([id, at]) => at >= since && planned.get(id)?.kind === 'normal')
      for (const [id] of recent.slice(-FAILOVER_REPLAYS)) {
        const original = planned.get(id)!
        const key = keys.get(id)
        if (!key) continue
        sendProbe(original.worker, {
          type: 'probe',
          intent: `f${String(++replays).padStart(5, '0')}`,
          of: id,
          kind: 'failover-replay',
          key,
          body: original.body,
        })
      }
    }
    const nemesisRandom = random.fork('nemesis')
    const burstRandom = random.fork('bursts')
    let bursts = 0
    /** `pg_terminate_backend` on every connection to the run's database but our own; how many it ended. */
    const terminateBackends = async (): Promise<number> => {
      const killed = await db.pool.query(
        'SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()',
        [db.name],
      )
      return killed.rows[0]?.n ?? 0
    }
    const nemesis = startNemesis({
      random: nemesisRandom,
      faults: options.faults,
      pauseMs: LEASE_MS + 1000,
      onError: (error) => log(`nemesis: ${(error as Error).message}`),
      actions: {
        async pauseServer(ms) {
          // A running instance (one may be restarting after a crash point); none: try again later.
          const candidates = servers.flatMap((s, i) => (s.running ? [i] : []))
          if (candidates.length === 0 || paused.size > 0) return false
          const i = nemesisRandom.pick(candidates)
          const server = servers[i]!
          paused.add(i)
          fault('nemesis', 'pause-server', server.name, 'start')
          server.pause()
          route()
          await new Promise((r) => setTimeout(r, ms))
          server.resume()
          paused.delete(i)
          route()
          fault('nemesis', 'pause-server', server.name, 'stop')
          return true
        },
        async restartDb() {
          if (!cluster || cluster.rebuilding) return false
          fault('nemesis', 'restart-db', 'postgres', 'start')
          await cluster.restartPrimary()
          fault('nemesis', 'restart-db', 'postgres', 'stop')
          return true
        },
        async failover() {
          if (!cluster?.standbyReady) return false
          const started = Date.now()
          const detail = { replication: options.replication }
          record('nemesis', { type: 'fault', fault: 'failover', target: 'postgres', phase: 'start', detail })
          cluster.holdReplication()
          const acked = () => [...createdAt.values()].filter((at) => at >= started).length
          await waitFor(() => Date.now() - started >= FAILOVER_LAG_MS[0], FAILOVER_LAG_MS[0])
          await waitFor(() => acked() >= FAILOVER_LAG_ACKS, FAILOVER_LAG_MS[1] - FAILOVER_LAG_MS[0])
          const { walLostBytes, lostSince } = await cluster.failover()
          record('nemesis', {
            type: 'fault',
            fault: 'failover',
            target: 'postgres',
            phase: 'stop',
            detail: {
              ...detail,
              walLostBytes,
              acknowledgedMeanwhile: acked(),
              ...(lostSince ? { lostSince } : {}),
            },
          })
          replayAfterFailover(Math.min(started, lostSince ?? started) - FAILOVER_MARGIN_MS)
          return true
        },
        async restartWorker() {
          if (!citus) return false
          const worker = nemesisRandom.pick(citus.nodes.filter((node) => node.name !== 'coordinator'))
          const how = nemesisRandom.int(0, 1) === 0 ? 'fast' : 'crash'
          record('nemesis', {
            type: 'fault',
            fault: 'restart-worker',
            target: worker.name,
            phase: 'start',
            detail: { how },
          })
          await citus.restart(worker.name, how)
          fault('nemesis', 'restart-worker', worker.name, 'stop')
          return true
        },
        async killWorkerConnections() {
          if (!citus) return false
          const nodeUrls = (db as CitusTestDatabase).nodeUrls.filter((node) => node.name !== 'coordinator')
          const worker = nemesisRandom.pick(nodeUrls)
          // The coordinator's connections to the worker, which carry the API's statements for that worker's shards.
          const client = new pg.Client({ connectionString: worker.url })
          client.on('error', () => {})
          await client.connect()
          try {
            const killed = await client.query(
              'SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()',
            )
            record('nemesis', {
              type: 'fault',
              fault: 'kill-worker-connections',
              target: worker.name,
              phase: 'once',
              detail: { terminated: killed.rows[0]?.n ?? 0 },
            })
          } finally {
            await client.end().catch(() => {})
          }
          return true
        },
        async restartPooler() {
          if (!bouncer) return false
          const how = nemesisRandom.int(0, 1) === 0 ? 'clean' : 'crash'
          record('nemesis', {
            type: 'fault',
            fault: 'restart-pooler',
            target: 'pgbouncer',
            phase: 'start',
            detail: { how },
          })
          await bouncer.restart(how)
          fault('nemesis', 'restart-pooler', 'pgbouncer', 'stop')
          return true
        },
        async killDbConnections() {
          const terminated = await terminateBackends()
          record('nemesis', {
            type: 'fault',
            fault: 'kill-db-connections',
            target: db.name,
            phase: 'once',
            detail: { terminated },
          })
          return true
        },
        async saturatePool() {
          const candidates = servers.flatMap((s, i) => (s.port !== undefined && !paused.has(i) ? [i] : []))
          if (candidates.length === 0) return false
          const server = servers[burstRandom.pick(candidates)]!
          const intents = planBurst(burstRandom, { round: ++bursts, size: BURST_SIZE })
          for (const intent of intents) raw.set(intent.id, intent)
          await saturate({
            intents,
            target: { name: server.name, port: () => server.port },
            record: (event) => record('nemesis', event),
            boundMs: LIVENESS_BOUND_MS,
            terminateAt: BURST_KILLS_MS,
            terminate: terminateBackends,
          })
          return true
        },
      },
    })
    const faultPhase = Date.now()
    // Like an app that retries its pending intents when the connection comes back: without it an intent whose
    // retries ran out during an outage would wait for the drain, and little would settle under faults.
    const resumer = setInterval(() => {
      for (const worker of workers) worker.send(JSON.stringify({ type: 'resume' }))
    }, RESUME_EVERY_MS)
    /**
     * Whether a probe can go now. Its original must have settled (so the key is taken). A probe that needs an
     * expired key (an expired replay, an expired changed payload) must also reach a key that no longer lives: the key that answered the original was reserved before it settled, so
     * it has expired once the retention has passed since; the table confirms it (or the reaper deleted the row).
     */
    const readiness = async (intent: PlannedIntent, final: boolean): Promise<Readiness> => {
      const key = keys.get(intent.of!)
      const settled = settledAt.get(intent.of!)
      if (!key || settled === undefined) return final ? 'never' : 'wait'
      if (!needsExpiredKey(intent.kind)) return 'send'
      if (Date.now() < settled + options.retentionMs) return 'wait'
      // The database may be restarting or failing over: ask again on a later turn.
      const alive = await db.pool
        .query('SELECT 1 FROM oncely.idempotency_keys WHERE scope = $1 AND key = $2 AND expires_at > now()', [
          intent.tenant,
          key,
        ])
        .then(({ rows }) => rows.length > 0)
        .catch(() => true)
      return alive ? 'wait' : 'send'
    }
    const io = {
      keys,
      readiness,
      send: (intent: PlannedIntent, command: Command) =>
        command.type === 'probe'
          ? sendProbe(intent.worker, command)
          : workers[intent.worker]!.send(JSON.stringify(command)),
      probeSent: (intent: PlannedIntent) => {
        probed.add(intent.kind)
        fault('generator', PROBE_FAULTS[intent.kind as ProbeIntentKind], intent.id)
      },
    }
    const probed = new Set<PlannedIntent['kind']>()
    const late = await dispatch(plan, {
      ...io,
      spacingMs: (options.durationMs * 0.6) / Math.max(1, options.intents),
      probeDeadline: faultPhase + options.durationMs,
      final: false,
    })
    const remaining = options.durationMs - (Date.now() - faultPhase)
    if (remaining > 0) await new Promise((r) => setTimeout(r, remaining))
    await overtime({
      faults: options.faults.filter((kind) => !PROBE_KINDS.has(kind)),
      happened: () => injectedFaults(history.events),
      maxMs: options.durationMs,
      log,
    })
    clearInterval(resumer)

    // Heal: no more network faults, crash points or pauses; servers restarted gracefully without crash points.
    await nemesis.stop()
    healed = true
    log('healing and draining')
    for (const proxy of proxies) proxy.setRates({})
    for (const worker of workers) worker.send(JSON.stringify({ type: 'heal' }))
    for (const server of servers) {
      supervised.delete(server)
      await server.stop()
      await server.start()
      record(server.name, { type: 'process', action: 'ready', pid: server.pid! })
      supervised.add(server)
      route()
    }
    // Drain until every worker reports nothing pending (or the rounds run out).
    draining = true
    for (let round = 0; round < DRAIN_ROUNDS; round++) {
      drained.clear()
      for (const worker of workers) worker.send(JSON.stringify({ type: 'drain' }))
      await waitFor(() => drained.size === workers.length, 120_000)
      if ([...drained.values()].every((pending) => pending.length === 0)) break
      await new Promise((r) => setTimeout(r, 2000))
    }
    // Probes whose original only settled in the drain (or whose key had not expired yet): those ready are sent now,
    // so every run probes each kind it planned. Only when a kind that needs an expired key could not be sent during
    // the fault phase do the late ones wait for their keys to expire (at most one retention), so the drain is not
    // usually longer.
    if (late.length > 0) {
      const awaitExpiry = late.some((intent) => needsExpiredKey(intent.kind) && !probed.has(intent.kind))
      const sent = await dispatch(late, {
        ...io,
        spacingMs: 50,
        probeDeadline: awaitExpiry ? Date.now() + options.retentionMs + 2_000 : 0,
        final: true,
      }).then((unsent) => late.filter((intent) => !unsent.includes(intent)))
      await waitFor(() => sent.every((intent) => answered.has(intent.id)), 120_000)
    }
    // Burst payments go again one after another, round-robin over the instances: settling finishes what a burst
    // left, it is not another burst.
    let burstsAgain = Promise.resolve()
    let nextInstance = 0
    await settle({
      tracker,
      timeoutMs: SETTLE_TIMEOUT_MS,
      held: () => keysInProgress(db.pool),
      sendAgain: async (intent) => {
        const sent = raw.get(intent.id)
        if (!sent) return
        const firstAttempt = intent.attempts + 1
        if ('command' in sent) {
          sendProbe(sent.worker, { ...sent.command, again: true, firstAttempt })
          return
        }
        const target = servers[nextInstance++ % servers.length]!
        burstsAgain = burstsAgain.then(async () => {
          await sendBurst({
            intents: [sent],
            target: () => ({ name: target.name, port: target.port }),
            record: (event) => record('nemesis', event),
            boundMs: LIVENESS_BOUND_MS,
            again: { firstAttempt: () => firstAttempt },
          })
        })
        await burstsAgain
      },
      log,
    })
    await health.stop()
    shuttingDown = true

    const finalDb = await readFinalDb(db.pool, { providerDb: provider.pool })
    const faults = injectedFaults(history.events)
    const result = check(history.events, finalDb, { retentionMs: options.retentionMs })
    const report = buildReport({
      options,
      result,
      history: history.events,
      historyFile: history.file,
      faults,
      startedAt,
      finishedAt: new Date(),
    })
    writeReport(options.report, report)
    if (!report.valid) {
      // The ledger as the checker saw it, always; a full pg_dump when the local pg_dump matches the server.
      writeFileSync(join(options.runDir, 'ledger.json'), `${JSON.stringify(finalDb, null, 2)}\n`)
      await dump(db.url, join(options.runDir, 'dump.sql'), log)
    }
    passed = report.valid
    return report
  } finally {
    process.off('SIGINT', onSignal)
    process.off('SIGTERM', onSignal)
    shuttingDown = true
    for (const fn of cleanup.reverse()) await fn().catch(() => {})
    history.close()
    await db.drop().catch(() => {})
    await cluster?.dispose()
    await citus?.stop()
    // A passing run keeps its history, logs and report; the cluster is only worth its space when a run failed.
    if (cluster && passed) rmSync(pgdata, { recursive: true, force: true })
  }
}
