// `pnpm bench`: starts the bench server on a fresh database, runs the suites and prints Markdown tables;
// `--json <file>` also writes the ratios and targets. See docs/benchmarks.md for the method.
import { randomUUID } from 'node:crypto'
import { writeFile } from 'node:fs/promises'
import { performance } from 'node:perf_hooks'
import { createTestDatabase } from '@oncely/test-support'
import { warmUpProcess } from './load.js'
import { describeMachine } from './machine.js'
import { parseOptions, USAGE } from './options.js'
import { postgresVisible } from './proc.js'
import { emptyReport, markdown, summary } from './report.js'
import { LEDGER_SCHEMA } from './server/ledger.js'
import { startServer } from './server/process.js'
import { baselineOf, REGISTRY } from './server/registry.js'
import { clientBench } from './suites/client.js'
import { compare, headToHead, type Scenario } from './suites/compare.js'
import { storm } from './suites/storm.js'
import { evaluateTargets } from './targets.js'

const POOL_SIZE = 10

/** `1M`, `3M`, `500k`, `0`: the shape suffix of a scale run. */
const rowLabel = (rows: number) =>
  rows >= 1_000_000 ? `${rows / 1_000_000}M` : rows >= 1_000 ? `${rows / 1_000}k` : String(rows)

const options = parseOptions(process.argv.slice(2))
if (!process.env.DATABASE_URL) {
  console.error(`DATABASE_URL is not set. Point it at a Postgres server the bench may create a database on, e.g.
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres pnpm bench -- --quick
or run it through the embedded Postgres:
  node scripts/with-postgres.mjs pnpm --filter @oncely/bench bench -- --quick

${USAGE}`)
  process.exit(2)
}

const defaults = options.quick
  ? { rounds: 3, c1: 300, c10: 1500, warmup: 200, stormKeys: 10, clientRequests: 300, headToHeadBlocks: 10 }
  : {
      rounds: 5,
      c1: 2000,
      c10: 10_000,
      warmup: 1000,
      stormKeys: 50,
      clientRequests: 2000,
      headToHeadBlocks: 10,
    }
const mode = options.requests
  ? {
      ...defaults,
      c10: options.requests,
      c1: Math.max(10, Math.round(options.requests / 5)),
      warmup: Math.min(defaults.warmup, options.requests),
    }
  : defaults
const log = (line: string) => console.error(line)

const db = await createTestDatabase('bench', { max: 4 })
const startedAt = new Date().toISOString()
const report = emptyReport({
  mode: options.quick ? 'quick' : 'full',
  startedAt,
  machine: await describeMachine(db.pool),
  rounds: mode.rounds,
})
await db.pool.query(LEDGER_SCHEMA)
// The bench server and its variants, for the suites that measure them (the others start what they measure).
const needsServer = (['server', 'storm', 'scale', 'cpu', 'adapters'] as const).some((suite) =>
  options.suites.has(suite),
)
/**
 * Starts each of `names` in a bench server process of its own, warmed up to its steady state (see warmUpProcess),
 * for the suites that judge one variant against another: in the shared process a variant pays for what the others
 * do there (the heap the collector walks, the replay caches' background checks), and oncely's ratio to the floor read
 * up to 0.04 higher there than alone. A variant that fails to set up is left out, as in the shared process.
 */
async function startAlone(names: readonly string[]) {
  const started = await Promise.allSettled(
    names.map((name) =>
      startServer({ databaseUrl: db.url, redisUrl: options.redisUrl, poolSize: POOL_SIZE, variants: [name] }),
    ),
  )
  const own = started.flatMap((result) => (result.status === 'fulfilled' ? [result.value] : []))
  const stop = async () => {
    await Promise.all(own.map((each) => each.stop()))
  }
  const failure = started.find((result) => result.status === 'rejected')
  if (failure) {
    await stop()
    throw failure.reason
  }
  const servers: Record<string, { url: string; pid: number }> = {}
  for (const [i, name] of names.entries()) {
    const url = own[i]?.urls[name]
    if (url) servers[name] = { url, pid: own[i]!.pid }
  }
  try {
    for (const [name, { url }] of Object.entries(servers))
      await warmUpProcess(url, `warm-up-${name}-${randomUUID()}`)
  } catch (error) {
    await stop()
    throw error
  }
  return { servers, stop }
}

const server = needsServer
  ? await startServer({
      databaseUrl: db.url,
      redisUrl: options.redisUrl,
      poolSize: POOL_SIZE,
      variants: options.variants,
    })
  : { urls: { baseline: '' } as Record<string, string>, failed: {}, pid: 0, stop: async () => {} }
report.failedVariants = server.failed
for (const [name, error] of Object.entries(server.failed)) log(`variant ${name} did not start: ${error}`)

try {
  if (needsServer && !server.urls.baseline)
    throw new Error(`the baseline did not start: ${server.failed.baseline}`)
  // The variants measured against a baseline (the baselines themselves are not scenarios), by suite.
  const running = Object.keys(server.urls).filter((name) => baselineOf(name) !== name)
  const ofSuite = (suite: 'server' | 'adapters') => running.filter((name) => REGISTRY[name]?.suite === suite)
  const scenariosOf = (variants: readonly string[]): Scenario[] =>
    variants.flatMap((variant) =>
      (['first', 'replay'] as const).map((path) => ({
        id: `${variant}-${path}`,
        variant,
        path,
        baseline: baselineOf(variant),
      })),
    )
  if (options.suites.has('server')) {
    const scenarios = scenariosOf(ofSuite('server'))
    report.server = await compare({
      urls: server.urls,
      pool: db.pool,
      scenarios,
      shapes: [
        { name: 'c1', connections: 1, amount: mode.c1 },
        { name: 'c10', connections: 10, amount: mode.c10 },
      ].filter((shape) => options.shapes.includes(shape.name as 'c1' | 'c10')),
      rounds: mode.rounds,
      warmupRequests: mode.warmup,
      log,
    })
    // The floor target, judged head to head: each protocol of oncely against the floor, run after run, each in a
    // server process of its own (see startAlone).
    if (options.shapes.includes('c10') && server.urls['sql-floor']) {
      for (const variant of ['oncely-lock', 'oncely-row'].filter((name) => server.urls[name])) {
        const alone = await startAlone([variant, 'sql-floor'])
        try {
          report.headToHead.push(
            await headToHead({
              urls: Object.fromEntries(Object.entries(alone.servers).map(([name, own]) => [name, own.url])),
              a: variant,
              b: 'sql-floor',
              shape: { name: 'c10', connections: 10, amount: mode.c10 },
              blocks: mode.headToHeadBlocks,
              log,
            }),
          )
        } finally {
          await alone.stop()
        }
      }
    }
  }
  if (options.suites.has('storm')) {
    log(`\nduplicate storm: ${mode.stormKeys} keys x ${POOL_SIZE * 3} copies (server pool ${POOL_SIZE})`)
    for (const variant of ['baseline', ...ofSuite('server')]) {
      const result = await storm({
        variant,
        url: server.urls[variant]!,
        pool: db.pool,
        keys: mode.stormKeys,
        copies: POOL_SIZE * 3,
      })
      log(
        `  ${variant}: ${result.executions} executions for ${result.keys} keys, p50 ${result.p50Ms.toFixed(2)} ms`,
      )
      report.storm.push(result)
    }
  }
  if (options.suites.has('client')) {
    log('\nclient write-ahead')
    report.client = await clientBench({ rounds: mode.rounds, requestsPerRound: mode.clientRequests, log })
  }
  if (options.suites.has('client-browser')) {
    // Loaded here so a machine without Playwright's package still runs the other suites.
    const { browserClientBench } = await import('./suites/client-browser.js')
    log('\nclient write-ahead in Chromium')
    const browser = await browserClientBench({
      rounds: mode.rounds,
      requestsPerRound: mode.clientRequests,
      resumeIntents: options.suites.has('scale') ? options.intents : 0,
      log,
    })
    report.client.push(...browser.client)
    report.resume.push(...browser.resume)
  }
  if (options.suites.has('scale')) {
    // Loaded here so the other suites still run while @oncely/server or @oncely/client cannot be imported.
    const scale = await import('./suites/scale.js')
    log('\nscale: reaper')
    report.reaper = await scale.reaperThroughput(db.pool, options.quick ? 100_000 : 1_000_000)
    log(`  ${report.reaper.rowsPerSecond.toFixed(0)} expired rows/s`)
    log('scale: resume()')
    const resumed = await scale.resumeTime(options.intents)
    report.resume.push(...resumed)
    for (const r of resumed) log(`  ${r.store}: ${r.intents} intents in ${r.seconds.toFixed(2)} s`)
    // Each started oncely protocol, with its cache-off twin when that was started too.
    const scaleScenarios: Scenario[] = ['oncely-lock', 'oncely-row']
      .filter((variant) => server.urls[variant])
      .flatMap((variant) => [
        ...scenariosOf([variant]),
        ...(server.urls[`${variant}-nocache`]
          ? [
              {
                id: `${variant}-nocache-replay`,
                variant: `${variant}-nocache`,
                path: 'replay' as const,
                baseline: 'baseline',
              },
            ]
          : []),
      ])
    if (scaleScenarios.length > 0) {
      for (const size of options.rows) {
        const label = rowLabel(size)
        const fillStart = performance.now()
        const added = await scale.fillKeys(db.pool, size)
        const rows = await scale.keyRows(db.pool)
        log(
          `scale: key table at ${rows} rows (${added} added in ${((performance.now() - fillStart) / 1000).toFixed(0)} s)`,
        )
        const summaries = await compare({
          urls: server.urls,
          pool: db.pool,
          scenarios: scaleScenarios,
          shapes: [
            { name: `c1@${label}`, connections: 1, amount: mode.c1 },
            { name: `c10@${label}`, connections: 10, amount: mode.c10 },
          ],
          rounds: 3,
          warmupRequests: mode.warmup,
          log,
        })
        report.scale.push(...summaries)
      }
    }
  }
  if (options.suites.has('adapters')) {
    const scenarios = scenariosOf(ofSuite('adapters'))
    if (scenarios.length > 0) {
      log('\nadapters and datasources, each against its own baseline')
      report.adapters = await compare({
        urls: server.urls,
        pool: db.pool,
        scenarios,
        shapes: [{ name: 'c10', connections: 10, amount: mode.c10 }],
        rounds: mode.rounds,
        warmupRequests: mode.warmup,
        log,
      })
    }
  }
  if (options.suites.has('accounting')) {
    const { accounting } = await import('./suites/accounting.js')
    log('\naccounting: round trips, statements, bytes and WAL per request, through a counting proxy')
    report.accounting = await accounting({
      databaseUrl: db.url,
      redisUrl: options.redisUrl,
      poolSize: POOL_SIZE,
      variants: options.variants,
      pool: db.pool,
      requests: options.quick ? Math.min(100, mode.c10) : 500,
      rounds: mode.rounds,
      log,
    })
  }
  if (options.suites.has('cpu')) {
    const { cpuSplit } = await import('./suites/cpu.js')
    if (!postgresVisible()) log('\ncpu: skipped (needs Linux /proc and a Postgres on this machine)')
    else {
      log('\nCPU per request, first execution and replay, 10 connections')
      // Each variant in a server process of its own, like the floor's head to head (see startAlone).
      const alone = await startAlone(Object.keys(server.urls))
      try {
        report.cpu = await cpuSplit({
          servers: alone.servers,
          pool: db.pool,
          // As many as a c10 run: at 500 a run's CPU per request moved by a factor of two between rounds, as the
          // compiler's and the collector's work on other threads fell into one run or another.
          requests: mode.c10,
          rounds: mode.rounds,
          log,
        })
      } finally {
        await alone.stop()
      }
    }
  }
  if (options.suites.has('otel')) {
    const { otelCost } = await import('./suites/otel.js')
    report.otel = await otelCost({
      databaseUrl: db.url,
      redisUrl: options.redisUrl,
      poolSize: POOL_SIZE,
      // Several alternating pairs even in --quick: a 5% bound needs more than three runs to be read.
      rounds: Math.max(mode.rounds, 5),
      connections: 10,
      amount: mode.c10,
      warmup: mode.warmup,
      log,
    })
  }
  if (options.suites.has('instances')) {
    const { instancesBench } = await import('./suites/instances.js')
    if (!postgresVisible()) log('\ninstances: skipped (needs Linux /proc and a Postgres on this machine)')
    else {
      log(`\ninstances: payments API x ${options.instances.join(', ')} on one Postgres`)
      report.instances = await instancesBench({
        counts: options.instances,
        connections: 16,
        requests: options.quick ? 1_500 : 5_000,
        warmup: mode.warmup,
        rounds: mode.rounds,
        reaperRows: options.quick ? 100_000 : 1_000_000,
        log,
      })
    }
  }
} finally {
  await server.stop()
  await db.drop()
}

report.targets = evaluateTargets(report)
console.log(markdown(report))
if (options.json) {
  await writeFile(options.json, `${JSON.stringify(summary(report), null, 2)}\n`)
  log(`\nwrote ${options.json}`)
}
