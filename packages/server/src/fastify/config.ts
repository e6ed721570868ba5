import type { FastifyRequest } from 'fastify'
import type pg from 'pg'
import type { ExecutionContext } from '../engine/types.js'
import type { AdapterOptions, IdempotencyRouteOptions } from '../http/options.js'

/**
 * Names the transaction type of your engine's datasource, once per application, for every route's
 * `request.idempotency.tx`. A Fastify request's type cannot see the plugin's options, so the type is registered
 * here, as `@fastify/jwt` registers its payload: augment this interface with `tx`. Without it, `tx` is a
 * `pg.PoolClient` (a node-postgres pool), and registering the plugin with an engine over another datasource does
 * not compile.
 *
 * @example
 * declare module '@oncely/server/fastify' {
 *   interface Register {
 *     tx: Transaction<DB> // Kysely's, or your library's: see the server README's table of datasources
 *   }
 * }
 */
// biome-ignore lint/suspicious/noEmptyInterface: augmented by the application
export interface Register {}

/** The transaction type named in {@link Register}, else node-postgres's. */
export type RegisteredTx = Register extends { tx: infer Tx } ? Tx : pg.PoolClient

/** The execution context of an idempotent Fastify route: `ctx.tx` is the {@link Register}ed transaction type. */
export type FastifyIdempotencyContext = ExecutionContext<RegisteredTx>

/**
 * Options of the {@link fastifyIdempotency} plugin: the engine, and `tenant`, which runs after your auth hooks. The
 * engine's transaction type must be the one named in {@link Register} (node-postgres's by default).
 *
 * @example
 * await app.register(fastifyIdempotency, { engine, tenant: (request) => request.user.accountId })
 */
export type FastifyIdempotencyOptions = AdapterOptions<FastifyRequest, [], RegisteredTx>

/**
 * The type of `request.idempotency` on a route whose config is `ContextConfig`: the execution context on routes
 * whose `config.idempotency` is `true` or an object without `required: false` (the plugin sets it before the
 * handler runs, or answers without running it), else possibly `null` (a route without the config, or an optional
 * route called without a key). Routes typed with explicit generics (`app.post<{ Body: B }>`) lose the inferred
 * config; pass it as the second generic (`app.post<{ Body: B }, { idempotency: true }>`) or check for `null`.
 */
export type FastifyIdempotencyOf<ContextConfig> = ContextConfig extends { idempotency: infer Route }
  ? Route extends true
    ? FastifyIdempotencyContext
    : Route extends object
      ? 'required' extends keyof Route
        ? false extends Route['required' & keyof Route]
          ? FastifyIdempotencyContext | null
          : FastifyIdempotencyContext
        : FastifyIdempotencyContext
      : FastifyIdempotencyContext | null
  : FastifyIdempotencyContext | null

declare module 'fastify' {
  interface FastifyContextConfig {
    /**
     * Makes this route idempotent (see `@oncely/server/fastify`). Only for POST, PUT, PATCH and DELETE routes
     * registered after the plugin.
     * @example
     * app.post('/v1/payments', { config: { idempotency: { required: true } } }, handler)
     */
    idempotency?: true | IdempotencyRouteOptions
  }
  // A module augmentation repeats every type parameter of the interface; only ContextConfig is used.
  interface FastifyRequest<
    RouteGeneric,
    RawServer,
    RawRequest,
    SchemaCompiler,
    TypeProvider,
    ContextConfig,
    Logger,
    RequestType,
  > {
    /**
     * The execution context of an idempotent route's handler: `tx` (the business transaction, typed by
     * {@link Register}), `key`, `stepKey()`, ... Set when the handler runs; `null` before, on other routes, and on
     * optional routes called without a key.
     */
    idempotency: FastifyIdempotencyOf<ContextConfig>
  }
}
