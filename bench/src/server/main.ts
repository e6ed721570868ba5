// The bench server: one process exposing every variant as its own Fastify app (`POST /ledger` on its own port). Started by
// the CLI as a child process so the load generator does not share its event loop. Prints one line
// `READY {"<variant>":{"port":...},...}` on stdout; a variant that fails to set up is reported with its error and
// left out, so the others still run.
import Fastify, { type FastifyInstance } from 'fastify'
import pg from 'pg'
import type { Variant } from './variant.js'

const loaders: Record<string, () => Promise<Variant>> = {
  baseline: async () => (await import('./baseline.js')).baseline,
  'oncely-row': async () => (await import('./oncely.js')).oncelyRow,
  'oncely-row-nocache': async () => (await import('./oncely.js')).oncelyRowNoCache,
  'oncely-lock': async () => (await import('./oncely.js')).oncelyLock,
  'oncely-lock-nocache': async () => (await import('./oncely.js')).oncelyLockNoCache,
  // Started by the otel suite in a server process of its own (see suites/otel.ts).
  'oncely-otel': async () => (await import('./otel.js')).oncelyOtel,
  'oncely-otel-noop': async () => (await import('./otel.js')).oncelyOtelNoop,
  'sql-floor': async () => (await import('./sql-floor.js')).sqlFloor,
  'engine-floor': async () => (await import('./oncely.js')).oncelyEngineOnly,
  'node-idempotency-pg': async () => (await import('./node-idempotency.js')).nodeIdempotencyPostgres,
  'node-idempotency-redis': async () => (await import('./node-idempotency.js')).nodeIdempotencyRedis,
  'powertools-redis': async () => (await import('./powertools.js')).powertools,
}

const VARIANT_NAMES = Object.keys(loaders).filter((name) => !name.startsWith('oncely-otel'))

// The otel suite's process: OpenTelemetry's context manager and propagator, as the Node SDK registers them.
if (process.env.BENCH_OTEL_CONTEXT === '1') (await import('./otel.js')).registerOtelContext()

const databaseUrl = process.env.BENCH_DATABASE_URL
if (!databaseUrl) throw new Error('BENCH_DATABASE_URL is required')
const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379'
const poolSize = Number(process.env.BENCH_POOL_SIZE ?? 10)
const wanted = (process.env.BENCH_VARIANTS ?? VARIANT_NAMES.join(',')).split(',')

const pool = new pg.Pool({ connectionString: databaseUrl, max: poolSize })
pool.on('error', () => {})
const apps: FastifyInstance[] = []
const closers: Array<() => Promise<void>> = []
const status: Record<string, { port: number } | { error: string }> = {}

/** Each variant gets its own Fastify instance and port, so one that fails to set up cannot affect the others. */
async function start(name: string): Promise<number> {
  const load = loaders[name]
  if (!load) throw new Error(`unknown variant (known: ${VARIANT_NAMES.join(', ')})`)
  const variant = await load()
  const app = Fastify({ logger: false })
  apps.push(app)
  await app.register(async (scope) => {
    closers.push(await variant.setup(scope, { pool, redisUrl }))
  })
  await app.listen({ host: '127.0.0.1', port: 0 })
  const address = app.server.address()
  return typeof address === 'object' && address ? address.port : 0
}

for (const name of wanted) {
  try {
    status[name] = { port: await start(name) }
  } catch (error) {
    status[name] = { error: error instanceof Error ? `${error.name}: ${error.message}` : String(error) }
  }
}

const shutdown = async () => {
  for (const app of apps) await app.close().catch(() => {})
  for (const close of closers) await close().catch(() => {})
  await pool.end()
  process.exit(0)
}
process.on('SIGTERM', shutdown)
process.on('SIGINT', shutdown)

process.stdout.write(`READY ${JSON.stringify(status)}\n`)
