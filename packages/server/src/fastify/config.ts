import type { FastifyRequest } from 'fastify'
import { positiveInteger } from '../engine/options.js'
import type { ErrorClass, ExecutionContext } from '../engine/types.js'

/** What counts toward a route's request fingerprint, beyond the method and the route template. */
export interface FingerprintConfig {
  /** Only these top-level body fields count (for example to ignore a client timestamp). @default all fields */
  include?: readonly string[]
  /** These top-level body fields do not count. Applied after `include`. @default [] */
  exclude?: readonly string[]
  /** Whether the query string counts. Off by default: most APIs carry no intent in the query of a POST. @default false */
  query?: boolean
}

/** Per-route settings, under `config.idempotency` of a route. `true` means all defaults. */
export interface IdempotencyRouteConfig {
  /** A request without a key gets 400 `idempotency_key_missing`. When false, it runs without the layer. @default true */
  required?: boolean
  /** The operation part of the scope. @default `${method} ${route template}`, such as 'POST /v1/payments/:id/refunds' */
  operation?: string
  /** Overrides the engine's `leaseMs`. */
  leaseMs?: number
  /** Overrides the engine's `retentionMs`: how long keys of this route are replayed. */
  retentionMs?: number
  /** Which request parts count toward the fingerprint. */
  fingerprint?: FingerprintConfig
  /** Wait (bounded) for an in-flight attempt with the same key and answer with its result instead of 409. */
  wait?: { timeoutMs: number }
  /**
   * Marks the route as naturally idempotent (an absolute set, a delete by id). Required for `failOpen`.
   * @default false
   */
  naturallyIdempotent?: boolean
  /** Run the handler even when the store is unavailable. Only allowed with `naturallyIdempotent: true`. @default false */
  failOpen?: boolean
  /** Classifies errors the handler throws. @default 4xx `statusCode` permanent, everything else retryable */
  classify?: (error: unknown) => ErrorClass
  /** Request headers stored with the key record (never authorization or cookies). @default [] */
  requestHeaders?: readonly string[]
  /** Largest accepted request body; larger gets 413 before anything is reserved. @default Fastify's bodyLimit */
  maxBodyBytes?: number
}

export interface ResolvedRouteConfig {
  required: boolean
  operation: string | undefined
  leaseMs: number | undefined
  retentionMs: number | undefined
  include: readonly string[] | undefined
  exclude: ReadonlySet<string>
  query: boolean
  wait: { timeoutMs: number } | undefined
  failOpen: boolean
  classify: ((error: unknown) => ErrorClass) | undefined
  requestHeaders: readonly string[]
  maxBodyBytes: number | undefined
}

const SECRET_HEADERS = new Set(['authorization', 'proxy-authorization', 'cookie', 'idempotency-key'])

/** Validates a route's `config.idempotency` when the route is registered, naming the route and the bad option. */
export function resolveRouteConfig(raw: true | IdempotencyRouteConfig, route: string): ResolvedRouteConfig {
  const config: IdempotencyRouteConfig = raw === true ? {} : raw
  const name = (option: string) => `config.idempotency.${option}\` of route \`${route}`
  if (typeof config !== 'object' || config === null) {
    throw new TypeError(`Expected \`config.idempotency\` of route ${route} to be true or an object.`)
  }
  const optionalInt = (option: 'leaseMs' | 'retentionMs' | 'maxBodyBytes') =>
    config[option] === undefined ? undefined : positiveInteger(name(option), config[option])
  if (config.failOpen && !config.naturallyIdempotent) {
    throw new TypeError(
      `Expected \`${name('failOpen')}\` to be used only with \`naturallyIdempotent: true\`; failing open on a route that is not naturally idempotent duplicates effects.`,
    )
  }
  const requestHeaders = (config.requestHeaders ?? []).map((header) => header.toLowerCase())
  for (const header of requestHeaders) {
    if (SECRET_HEADERS.has(header)) {
      throw new TypeError(`Expected \`${name('requestHeaders')}\` not to contain ${header}.`)
    }
  }
  if (config.wait !== undefined) positiveInteger(name('wait.timeoutMs'), config.wait?.timeoutMs)
  return {
    required: config.required ?? true,
    operation: config.operation,
    leaseMs: optionalInt('leaseMs'),
    retentionMs: optionalInt('retentionMs'),
    include: config.fingerprint?.include,
    exclude: new Set(config.fingerprint?.exclude ?? []),
    query: config.fingerprint?.query ?? false,
    wait: config.wait,
    failOpen: config.failOpen ?? false,
    classify: config.classify,
    requestHeaders,
    maxBodyBytes: optionalInt('maxBodyBytes'),
  }
}

/** Options of the {@link idempotency} plugin. */
export interface IdempotencyPluginOptions {
  /** The engine from `createEngine()`. */
  engine: import('../engine/types.js').Engine
  /**
   * The scope of a request's keys: the tenant or user id from authentication. Runs after your auth hooks. Never read
   * it from a header the client controls, or one tenant can replay another's responses.
   *
   * @example
   * tenant: (request) => request.user.accountId
   */
  tenant: (request: FastifyRequest) => string | Promise<string>
}

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Makes this route idempotent (see `@oncely/server/fastify`). GET, HEAD and OPTIONS are never affected. */
    idempotency?: true | IdempotencyRouteConfig
  }
  interface FastifyRequest {
    /** The execution context on idempotent routes: `tx` (the business transaction), `key`, `stepKey()`, ... */
    idempotency: ExecutionContext
  }
}
