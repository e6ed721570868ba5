/**
 * Starts the payments API: reads the configuration, starts an embedded Postgres when DATABASE_URL is unset, listens,
 * waits for the database (answering 503 meanwhile, `/healthz` saying what it waits for) and migrates it, and on
 * SIGINT or SIGTERM stops in order (HTTP server, pool, Postgres) so nothing is left behind.
 */
import { createServer, type RequestListener } from 'node:http'
import { PROBLEM_CONTENT_TYPE } from '@oncely/protocol'
import pg from 'pg'
import { buildApp } from './app.js'
import { ConfigError, loadConfig } from './config.js'
import { prepareDatabase, untilReachable } from './database.js'
import { DEFAULT_DATA_DIR, type EmbeddedPostgres, startEmbeddedPostgres } from './embedded-postgres.js'
import { demoProblem } from './problems.js'
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

const pool = new pg.Pool({ connectionString: databaseUrl, max: config.poolSize })
// An idle client's error (Postgres restarted) must not crash the process; the next query reconnects.
pool.on('error', (error) => console.error(`payments-api: idle database connection lost: ${error.message}`))
// The payment steps' own transactions: a request holds a `pool` connection for its business transaction while its
// charge step takes one from here, so a burst that fills `pool` cannot leave every request waiting on the other.
const stepsPool = new pg.Pool({ connectionString: databaseUrl, max: 10 })
stepsPool.on('error', () => {})
// The provider is another system: its own connections, on its own database when PROVIDER_DATABASE_URL names one.
const providerPool = new pg.Pool({ connectionString: config.providerDatabaseUrl ?? databaseUrl, max: 5 })
providerPool.on('error', () => {})
// A checked-out client whose connection is killed (pg_terminate_backend, a Postgres restart) emits 'error'; with no
// listener Node crashes. A permanent listener attached once per connection, when the pool opens it, covers every
// client, including those of the chaos-only "idempotency off" path. The failure still reaches whoever uses the
// client through its failed query.
for (const each of [pool, stepsPool, providerPool]) {
  each.on('connect', (client) => client.on('error', () => {}))
}

/**
 * While it starts, the instance answers on its port at once: `/healthz` 503 with `status: 'starting'` and what it
 * waits for, anything else 503 with `Retry-After: 1`. The same server then serves the app (Fastify's
 * `serverFactory`), so the port never closes in between.
 */
let waitingFor = 'the database'
const server = createServer((request, response) => {
  const health = request.url === '/healthz'
  const body = health
    ? { status: 'starting', waitingFor }
    : demoProblem('starting', `The service is starting: it waits for ${waitingFor}.`)
  response.writeHead(503, {
    'content-type': health ? 'application/json' : PROBLEM_CONTENT_TYPE,
    'retry-after': '1',
  })
  response.end(JSON.stringify(body))
})
const startingHandler = server.listeners('request')[0] as RequestListener

// Aborts the wait for the database when a signal stops the instance while it starts.
const starting = new AbortController()
async function shutdown(code: number): Promise<never> {
  starting.abort(new Error('stopping'))
  await app?.close().catch(() => {})
  server.closeAllConnections()
  await new Promise((resolve) => server.close(resolve))
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
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(config.port, config.host, resolve)
  })
  const address = server.address()
  const port = typeof address === 'object' && address ? address.port : config.port
  const shown = config.host.includes(':') ? `[${config.host}]` : config.host
  console.log(`payments-api: listening at http://${shown}:${port}/, waiting for the database`)
  // The database may be down or restarting (a failover, a restart): wait for it with bounded backoff, not exit.
  const target = new URL(databaseUrl)
  const { applied } = await untilReachable(
    () =>
      prepareDatabase(pool, {
        ...(config.providerDatabaseUrl !== databaseUrl ? { providerPool } : {}),
        unsafeDisableBackstop: config.chaos?.disableBackstop === true,
        distribution: config.distribution,
      }),
    {
      what: `the database at ${target.host}${target.pathname}`,
      log: (line) => console.warn(`payments-api: ${line}`),
      onWaiting: (reason) => {
        if (reason !== undefined) waitingFor = `the database (${reason})`
      },
      signal: starting.signal,
    },
  )
  if (applied.length > 0) console.log(`payments-api: applied migrations ${applied.join(', ')}`)
  let serve: RequestListener | undefined
  app = await buildApp({
    pool,
    stepsPool,
    // The slow test card outlives the lease, so a charge that slow shows what the engine does with a lost lease.
    provider: createProvider({ pool: providerPool, ...config.provider, slowCardMs: config.leaseMs + 1000 }),
    leaseMs: config.leaseMs,
    retentionMs: config.retentionMs,
    reservation: config.reservation,
    behindTransactionPooler: config.pooler === 'transaction',
    replayCache: config.replayCache,
    serverFactory: (handler) => {
      serve = handler
      return server
    },
    ...(config.chaos ? { chaos: config.chaos } : {}),
    logger: { level: config.logLevel },
  })
  await app.ready()
  server.off('request', startingHandler)
  server.on('request', serve!)
  if (config.chaos) console.log('payments-api: ONCELY_CHAOS=1, fault injection is on')
  console.log(`payments-api: ready at http://${shown}:${port}/ (checkout page at /, API at /v1/payments)`)
} catch (error) {
  if (!stopping) {
    console.error('payments-api: could not start:', error instanceof Error ? error.message : error)
    await shutdown(1)
  }
}
