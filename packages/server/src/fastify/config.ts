import type { FastifyRequest } from 'fastify'
import type { ExecutionContext } from '../engine/types.js'
import type { AdapterOptions, FingerprintOptions, IdempotencyRouteOptions } from '../http/options.js'

/** What counts toward a route's request fingerprint, beyond the method and the route template. */
export type FingerprintConfig = FingerprintOptions

/** Per-route settings, under `config.idempotency` of a route. `true` means all defaults. */
export type IdempotencyRouteConfig = IdempotencyRouteOptions

/**
 * Options of the {@link idempotency} plugin: the engine, and `tenant`, which runs after your auth hooks.
 *
 * @example
 * await app.register(idempotency, { engine, tenant: (request) => request.user.accountId })
 */
export type IdempotencyPluginOptions = AdapterOptions<FastifyRequest>

/**
 * The type of `request.idempotency` on a route whose config is `ContextConfig`: the execution context on routes
 * whose `config.idempotency` is `true` or an object without `required: false` (the plugin sets it before the
 * handler runs, or answers without running it), else possibly `null` (a route without the config, or an optional
 * route called without a key). Routes typed with explicit generics (`app.post<{ Body: B }>`) lose the inferred
 * config; pass it as the second generic (`app.post<{ Body: B }, { idempotency: true }>`) or check for `null`.
 */
export type IdempotencyOf<ContextConfig> = ContextConfig extends { idempotency: infer Route }
  ? Route extends true
    ? ExecutionContext
    : Route extends object
      ? 'required' extends keyof Route
        ? false extends Route['required' & keyof Route]
          ? ExecutionContext | null
          : ExecutionContext
        : ExecutionContext
      : ExecutionContext | null
  : ExecutionContext | null

declare module 'fastify' {
  interface FastifyContextConfig {
    /**
     * Makes this route idempotent (see `@oncely/server/fastify`). Only for POST, PUT, PATCH and DELETE routes
     * registered after the plugin.
     * @example
     * app.post('/v1/payments', { config: { idempotency: { required: true } } }, handler)
     */
    idempotency?: true | IdempotencyRouteConfig
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
     * The execution context of an idempotent route's handler: `tx` (the business transaction), `key`, `stepKey()`,
     * ... Set when the handler runs; `null` before, on other routes, and on optional routes called without a key.
     */
    idempotency: IdempotencyOf<ContextConfig>
  }
}
