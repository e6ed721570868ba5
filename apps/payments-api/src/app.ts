/**
 * Builds the payments API as a Fastify instance without listening, so tests drive it with `inject()` and
 * `main.ts` decides the port, the database and the signals.
 */
import { randomUUID } from 'node:crypto'
import {
  createEngine,
  type Engine,
  type EngineEvent,
  type EngineOptions,
  postgresStore,
} from '@oncely/server'
import { fastifyIdempotency } from '@oncely/server/fastify'
import { instrumentEngine } from '@oncely/server/otel'
import Fastify, { type FastifyInstance, type FastifyServerOptions } from 'fastify'
import pg from 'pg'
import { registerAuth } from './auth.js'
import type { ChaosConfig } from './config.js'
import { ONCELY_SCHEMA } from './database.js'
import { createFaults, type Faults } from './faults.js'
import { createMetrics, type Metrics, registerMetricsRoute } from './metrics.js'
import { createPaymentHandler } from './payment-steps.js'
import { clientErrorHandler, frameworkErrors, registerErrorHandler, renderProblem } from './problems.js'
import { createProvider, type Provider } from './provider.js'
import { DEFAULT_WEB_ROOT, registerCheckoutPage } from './routes/checkout-page.js'
import { registerHealthRoute } from './routes/health.js'
import { registerLedgerRoute } from './routes/ledger.js'
import { type PaymentExecutionSource, registerPaymentRoutes } from './routes/payments.js'

/** Options of {@link buildApp}. */
export interface AppOptions {
  /** The database, already migrated (see `prepareDatabase`). */
  pool: pg.Pool
  /**
   * Pool for the payment steps' own transactions (each execution holds a `pool` connection for its business
   * transaction while a step takes one from here, so it must not be `pool`: `steps()` refuses that).
   * @default a pool of its own with `pool`'s settings, ended when the app closes
   */
  stepsPool?: pg.Pool
  /**
   * The payment provider.
   * @default createProvider({ pool }) — instant, never failing
   */
  provider?: Provider
  /** Reservation lease, in ms. @default 30_000 */
  leaseMs?: number
  /** How long finished keys are replayed, in ms. @default 86_400_000 */
  retentionMs?: number
  /** The engine's reservation protocol (see `EngineOptions.reservation`). @default 'lock' */
  reservation?: 'row' | 'lock'
  /**
   * `pool` reaches Postgres through a pooler in transaction mode (PgBouncer, RDS Proxy...): the idempotency store
   * sends its statements unnamed (`postgresStore({ preparedStatements: false })`).
   * @default false
   */
  behindTransactionPooler?: boolean
  /**
   * The engine's in-process replay cache (`EngineOptions.replayCache`).
   * @default true
   */
  replayCache?: boolean
  /**
   * Fastify's `serverFactory`: `main.ts` hands over the HTTP server that answered 503 while the database was not
   * there yet, so the port stays the same and open throughout.
   * @default Fastify's own server
   */
  serverFactory?: FastifyServerOptions['serverFactory']
  /** Fault injection (`ONCELY_CHAOS=1` only). @default undefined: none */
  chaos?: ChaosConfig
  /** Replaces the faults built from `chaos`, for tests. */
  faults?: Faults
  /**
   * Directory of the built checkout page served at `/`, or `false` for none.
   * @default apps/checkout-web/dist
   */
  webRoot?: string | false
  /** Fastify's logger option. @default false */
  logger?: FastifyServerOptions['logger']
  /** Receives the engine's events (reserved, replayed, takeover, ...), for logs and tests. */
  onEvent?: (event: EngineEvent) => void
  /**
   * The metrics served at `GET /metrics` (Prometheus text), or `false` for none.
   * @default createMetrics(): a MeterProvider of this app's own, read by the Prometheus exporter
   */
  metrics?: Metrics | false
}

/**
 * Creates the API. The caller owns the pool; `app.close()` stops the key reaper but does not end the pool.
 *
 * @example
 * const app = await buildApp({ pool })
 * const res = await app.inject({ method: 'GET', url: '/healthz' })
 */
export async function buildApp(options: AppOptions): Promise<FastifyInstance> {
  const { pool, chaos } = options
  const faults = options.faults ?? createFaults(chaos)
  const provider = options.provider ?? createProvider({ pool })

  const app = Fastify({
    logger: options.logger ?? false,
    ...(options.serverFactory ? { serverFactory: options.serverFactory } : {}),
    // Reject what does not match the schema instead of reshaping it: "100" is not an amount, and an unknown member
    // is a client bug worth a 400, not something to drop silently.
    ajv: { customOptions: { coerceTypes: false, removeAdditional: false } },
    frameworkErrors,
    clientErrorHandler,
  })
  registerErrorHandler(app)
  // Before the idempotency plugin, so an unauthenticated request is refused before anything is reserved.
  registerAuth(app)

  const metrics = options.metrics === false ? undefined : (options.metrics ?? createMetrics())
  // Fault injection lives in `@oncely/server/testing`, which the demo itself must never need: it is loaded only for
  // the chaos suite (ONCELY_CHAOS=1) and for tests that hand the app faults.
  const injection = chaos || options.faults ? await import('./fault-injection.js') : undefined
  const execution = chaos?.disableIdempotency
    ? withoutIdempotency(pool)
    : await withIdempotency(app, createPaymentsEngine(app, options, { faults, injection }, metrics))

  const handle = createPaymentHandler({
    stepsPool: options.stepsPool ?? ownPool(app, pool),
    provider,
    faults,
    ...(injection ? { steps: injection.faultySteps(faults) } : {}),
  })
  registerPaymentRoutes(app, { pool, handle, execution })
  registerHealthRoute(app, pool)
  if (metrics) registerMetricsRoute(app, metrics)
  registerLedgerRoute(app, pool)
  if (options.webRoot !== false) registerCheckoutPage(app, options.webRoot ?? DEFAULT_WEB_ROOT)

  app.addHook('onResponse', async (request) => {
    if (request.method === 'POST' && request.routeOptions.url === '/v1/payments')
      await faults.at('after-reply')
  })
  return app
}

function createPaymentsEngine(
  app: FastifyInstance,
  options: AppOptions,
  { faults, injection }: { faults: Faults; injection: typeof import('./fault-injection.js') | undefined },
  metrics: Metrics | undefined,
): Engine {
  const engineOptions: EngineOptions = {
    store: postgresStore({
      pool: options.pool,
      schema: ONCELY_SCHEMA,
      preparedStatements: options.behindTransactionPooler !== true,
    }),
    leaseMs: options.leaseMs ?? 30_000,
    ...(options.replayCache === false ? { replayCache: false as const } : {}),
    retentionMs: options.retentionMs ?? 86_400_000,
    reservation: options.reservation ?? 'lock',
    onEvent: (event) => {
      app.log.debug({ event: { ...event, error: undefined } }, `oncely ${event.type}`)
      options.onEvent?.(event)
    },
  }
  // Only the chaos suite injects faults into the engine (and, to prove its checker, switches the fence off).
  const engine = injection
    ? injection.faultyEngine(engineOptions, faults, options.chaos?.disableFencing === true)
    : createEngine(engineOptions)
  const stopReaper = engine.startReaper()
  app.addHook('onClose', async () => stopReaper())
  // Requests by outcome, durations, takeovers, keys in progress, store errors and reaper runs, at GET /metrics.
  return metrics ? instrumentEngine(engine, { meterProvider: metrics.meterProvider }) : engine
}

async function withIdempotency(app: FastifyInstance, engine: Engine): Promise<PaymentExecutionSource> {
  await app.register(fastifyIdempotency, { engine, tenant: (request) => request.tenant })
  return {
    // A thrown business error (a refused card) is stored and replayed as the problem+json the API sends for it.
    routeConfig: { idempotency: { required: true, renderError: renderProblem } },
    run: (request, work) => {
      // The route requires a key, so the plugin runs it only with a context; the type cannot see the route's config.
      if (!request.idempotency) throw new Error('POST /v1/payments ran without its idempotency context')
      return work(request.idempotency)
    },
  }
}

// Chaos only (ONCELY_UNSAFE_DISABLE_IDEMPOTENCY=1): a plain transaction, a fresh provider key per attempt and no
// recovery point, which is what an API without idempotency does. The chaos suite uses it to prove its checker sees
// duplicates.
function withoutIdempotency(pool: pg.Pool): PaymentExecutionSource {
  return {
    routeConfig: {},
    async run(request, work) {
      const tx = await pool.connect()
      try {
        await tx.query('BEGIN')
        const key = request.headers['idempotency-key']
        const result = await work({
          tx,
          scope: request.tenant,
          operation: 'POST /v1/payments',
          key: typeof key === 'string' ? key : '',
          attempt: 1,
          recoveryPoint: null,
          saveRecoveryPoint: async () => true,
          stepKey: (step) => `${randomUUID()}:${step}`,
          signal: new AbortController().signal,
        })
        await tx.query('COMMIT')
        return result
      } catch (error) {
        await tx.query('ROLLBACK').catch(() => {})
        throw error
      } finally {
        tx.release()
      }
    },
  }
}

/** A pool with `like`'s settings that the app owns: ended when it closes. */
function ownPool(app: FastifyInstance, like: pg.Pool): pg.Pool {
  const own = new pg.Pool(like.options)
  own.on('error', () => {}) // an idle client losing its server must not crash the process
  app.addHook('onClose', () => own.end())
  return own
}
