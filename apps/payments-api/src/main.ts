/**
 * Starts the payments API: reads the configuration, starts an embedded Postgres when DATABASE_URL is unset,
 * migrates, listens, and on SIGINT or SIGTERM stops in order (HTTP server, pool, Postgres) so nothing is left behind.
 */
import pg from 'pg'
import { buildApp } from './app.js'
import { ConfigError, loadConfig } from './config.js'
import { prepareDatabase } from './database.js'
import { DEFAULT_DATA_DIR, type EmbeddedPostgres, startEmbeddedPostgres } from './embedded-postgres.js'
import { createProvider } from './provider.js'

function fail(message: string): never {
  console.error(`payments-api: ${message}`)
  process.exit(1)
}

let config: ReturnType<typeof loadConfig>
try {
  config = loadConfig()
} catch (error) {
  if (error instanceof ConfigError) fail(error.message)
  throw error
}

let embedded: EmbeddedPostgres | undefined
let databaseUrl = config.databaseUrl
if (databaseUrl === undefined) {
  console.log(
    `payments-api: DATABASE_URL is unset; starting an embedded Postgres with its data in ${DEFAULT_DATA_DIR}`,
  )
  embedded = await startEmbeddedPostgres().catch((error: Error) => fail(error.message))
  databaseUrl = embedded.url
}

const pool = new pg.Pool({ connectionString: databaseUrl, max: 20 })
// An idle client's error (Postgres restarted) must not crash the process; the next query reconnects.
pool.on('error', (error) => console.error(`payments-api: idle database connection lost: ${error.message}`))
// The payment steps' own transactions: a request holds a `pool` connection for its business transaction while its
// charge step takes one from here, so a burst that fills `pool` cannot leave every request waiting on the other.
const stepsPool = new pg.Pool({ connectionString: databaseUrl, max: 10 })
stepsPool.on('error', () => {})
const providerPool = new pg.Pool({ connectionString: databaseUrl, max: 5 })
providerPool.on('error', () => {})
// A checked-out client whose connection is killed (pg_terminate_backend, a Postgres restart) emits 'error'; with no
// listener Node crashes. A permanent listener attached once per connection, when the pool opens it, covers every
// client, including those of the chaos-only "idempotency off" path. The failure still reaches whoever uses the
// client through its failed query.
for (const each of [pool, stepsPool, providerPool]) {
  each.on('connect', (client) => client.on('error', () => {}))
}

async function shutdown(code: number): Promise<never> {
  await app?.close().catch(() => {})
  await Promise.allSettled([pool.end(), stepsPool.end(), providerPool.end()])
  await embedded?.stop()
  process.exit(code)
}

let app: Awaited<ReturnType<typeof buildApp>> | undefined
let stopping = false
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (stopping) return
    stopping = true
    console.log(`payments-api: ${signal} received, stopping`)
    void shutdown(0)
  })
}

try {
  const { applied } = await prepareDatabase(pool)
  if (applied.length > 0) console.log(`payments-api: applied migrations ${applied.join(', ')}`)
  app = await buildApp({
    pool,
    stepsPool,
    // The provider is another system: its own connections, never the API's transaction.
    provider: createProvider({ pool: providerPool, ...config.provider }),
    leaseMs: config.leaseMs,
    retentionMs: config.retentionMs,
    reservation: config.reservation,
    ...(config.chaos ? { chaos: config.chaos } : {}),
    logger: { level: config.logLevel },
  })
  if (config.chaos) console.log('payments-api: ONCELY_CHAOS=1, fault injection is on')
  await app.listen({ port: config.port, host: config.host })
  const address = app.server.address()
  const port = typeof address === 'object' && address ? address.port : config.port
  const shown = config.host.includes(':') ? `[${config.host}]` : config.host
  console.log(`payments-api: ready at http://${shown}:${port}/ (checkout page at /, API at /v1/payments)`)
} catch (error) {
  console.error('payments-api: could not start:', error instanceof Error ? error.message : error)
  await shutdown(1)
}
