// The bench server: one process exposing every variant as its own server (`POST /ledger` on its own port: a Fastify app,
// or the framework of the adapter it measures). Started by
// the CLI as a child process so the load generator does not share its event loop. Prints one line
// `READY {"<variant>":{"port":...},...}` on stdout; a variant that fails to set up is reported with its error and
// left out, so the others still run.
import Fastify from 'fastify'
import pg from 'pg'
import { REGISTRY, VARIANT_NAMES } from './registry.js'
import type { Listening, VariantContext } from './variant.js'

// The otel suite's process: OpenTelemetry's context manager and propagator, as the Node SDK registers them.
if (process.env.BENCH_OTEL_CONTEXT === '1') (await import('./otel.js')).registerOtelContext()

const databaseUrl = process.env.BENCH_DATABASE_URL
if (!databaseUrl) throw new Error('BENCH_DATABASE_URL is required')
const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379'
const poolSize = Number(process.env.BENCH_POOL_SIZE ?? 10)
const wanted = (process.env.BENCH_VARIANTS ?? VARIANT_NAMES.join(',')).split(',')

const idleMs = 1_000
const pool = new pg.Pool({ connectionString: databaseUrl, max: poolSize, idleTimeoutMillis: idleMs })
pool.on('error', () => {})
const context: VariantContext = { pool, databaseUrl, poolSize, idleMs, redisUrl }
const servers: Listening[] = []
const status: Record<string, { port: number } | { error: string }> = {}

/** Each variant gets its own server and port, so one that fails to set up cannot affect the others. */
async function start(name: string): Promise<number> {
  const entry = REGISTRY[name]
  if (!entry) throw new Error(`unknown variant (known: ${VARIANT_NAMES.join(', ')})`)
  const variant = await entry.load()
  if (variant.listen) {
    const server = await variant.listen(context)
    servers.push(server)
    return server.port
  }
  const app = Fastify({ logger: false })
  let close = async () => {}
  servers.push({
    port: 0,
    close: async () => {
      await app.close()
      await close()
    },
  })
  await app.register(async (scope) => {
    close = await variant.setup(scope, context)
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
  for (const server of servers) await server.close().catch(() => {})
  await pool.end()
  process.exit(0)
}
process.on('SIGTERM', shutdown)
process.on('SIGINT', shutdown)

process.stdout.write(`READY ${JSON.stringify(status)}\n`)
