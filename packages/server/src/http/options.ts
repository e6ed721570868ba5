import type pg from 'pg'
import type { Engine, ErrorClass, HandlerResponse } from '../engine/types.js'
import {
  engineOption,
  headerNames,
  nonEmptyString,
  objectOption,
  objectOptions,
  objectOrFlag,
  optionalBoolean,
  optionalFunction,
  optionalLogger,
  optionName,
  positiveInteger,
  requiredFunction,
  stringArray,
} from '../options/check.js'

/** What counts toward a route's request fingerprint, beyond the method and the route template. */
export interface FingerprintOptions {
  /**
   * Only these top-level body fields count.
   * @default all fields
   * @example
   * fingerprint: { include: ['amount', 'currency'] }
   */
  include?: readonly string[]
  /**
   * These top-level body fields do not count (applied after `include`), for example a client timestamp.
   * @default []
   * @example
   * fingerprint: { exclude: ['clientTime'] }
   */
  exclude?: readonly string[]
  /**
   * Whether the query string counts. Off by default: most APIs carry no intent in the query of a POST.
   * @default false
   * @example
   * fingerprint: { query: true }
   */
  query?: boolean
}

/** The idempotency settings of one route, the same for every adapter. */
export interface IdempotencyRouteOptions {
  /**
   * A request without an `Idempotency-Key` gets 400 `idempotency_key_missing`. When false, such a request runs
   * without the layer (and without a transaction from it).
   * @default true
   * @example
   * { required: false }
   */
  required?: boolean
  /**
   * The operation part of the key's scope: the same key on two operations is two records.
   * @default `${method} ${route template}`, such as 'POST /v1/payments/:id/refunds'
   * @example
   * { operation: 'create-payment' }
   */
  operation?: string
  /**
   * How long an attempt holds the key before another may take over, in ms.
   * @default the engine's `leaseMs`
   * @example
   * { leaseMs: 120_000 }
   */
  leaseMs?: number
  /**
   * How long keys of this route are replayed, in ms.
   * @default the engine's `retentionMs`
   * @example
   * { retentionMs: 7 * 86_400_000 }
   */
  retentionMs?: number
  /**
   * Which request parts count toward the fingerprint.
   * @default the whole body, not the query
   * @example
   * { fingerprint: { exclude: ['clientTime'] } }
   */
  fingerprint?: FingerprintOptions
  /**
   * Wait (bounded) for an in-flight attempt with the same key and answer with its result instead of 409.
   * @default undefined: answer 409 at once
   * @example
   * { wait: { timeoutMs: 5_000 } }
   */
  wait?: { timeoutMs: number }
  /**
   * Marks the route as naturally idempotent (an absolute set, a delete by id). Required for `failOpen`.
   * @default false
   * @example
   * { naturallyIdempotent: true, failOpen: true }
   */
  naturallyIdempotent?: boolean
  /**
   * Run the handler even when the store is unavailable. Only allowed with `naturallyIdempotent: true`.
   * @default false
   * @example
   * { naturallyIdempotent: true, failOpen: true }
   */
  failOpen?: boolean
  /**
   * Classifies an error the handler throws: `'permanent'` is stored and replayed, `'retryable'` releases the key.
   * @default a 4xx `statusCode` or `status` is permanent, everything else retryable
   * @example
   * { classify: (error) => (error instanceof CardDeclined ? 'permanent' : 'retryable') }
   */
  classify?: (error: unknown) => ErrorClass
  /**
   * Renders a permanent error as the response to store and replay.
   * @default JSON `{ statusCode, code, error, message }` with the error's 4xx status
   * @example
   * { renderError: (error) => ({ status: 402, body: { type: 'card_declined' } }) }
   */
  renderError?: (error: unknown) => HandlerResponse
  /**
   * Request headers stored with the key record. Never `authorization`, `cookie` or the key itself.
   * @default []
   * @example
   * { requestHeaders: ['user-agent'] }
   */
  requestHeaders?: readonly string[]
  /**
   * Largest accepted request body in bytes; a larger one gets 413 before anything is reserved.
   * @default 1_048_576 (Fastify: its `bodyLimit`)
   * @example
   * { maxBodyBytes: 16_384 }
   */
  maxBodyBytes?: number
}

/** A route's options, validated once when the route is set up. */
export interface ResolvedRoute {
  required: boolean
  operation: string | undefined
  leaseMs: number | undefined
  retentionMs: number | undefined
  include: readonly string[] | undefined
  exclude: ReadonlySet<string> | undefined
  query: boolean
  wait: { timeoutMs: number } | undefined
  failOpen: boolean
  classify: ((error: unknown) => ErrorClass) | undefined
  renderError: ((error: unknown) => HandlerResponse) | undefined
  requestHeaders: readonly string[]
  maxBodyBytes: number | undefined
}

const SECRET_HEADERS = new Set(['authorization', 'proxy-authorization', 'cookie', 'idempotency-key'])

/**
 * How a route's options are named in error messages: what they are options of (``'`idempotent()`'``, or
 * ``'route `POST /x`'``), and, where they sit under another option, its name (`'config.idempotency'`).
 */
export interface RouteNaming {
  of: string
  under?: string
}

/** Validates a route's options when the route is set up, with a TypeError that names the bad option. */
export function resolveRoute(
  raw: true | IdempotencyRouteOptions | undefined,
  naming: RouteNaming,
): ResolvedRoute {
  const { under } = naming
  const name = (option: string) => (under === undefined ? option : `${under}.${option}`)
  const context = { of: naming.of }
  const given = objectOrFlag(under ?? 'options', raw, true, context)
  const options: IdempotencyRouteOptions = given === true || given === undefined ? {} : given
  const optionalInt = (option: 'leaseMs' | 'retentionMs' | 'maxBodyBytes') =>
    options[option] === undefined ? undefined : positiveInteger(name(option), options[option], context)
  const naturallyIdempotent = optionalBoolean(
    name('naturallyIdempotent'),
    options.naturallyIdempotent,
    false,
    context,
  )
  const failOpen = optionalBoolean(name('failOpen'), options.failOpen, false, context)
  if (failOpen && !naturallyIdempotent) {
    throw new TypeError(
      `Expected ${optionName(name('failOpen'), context)} to be used only with \`naturallyIdempotent: true\`; failing open on a route that is not naturally idempotent duplicates effects.`,
    )
  }
  if (options.operation !== undefined) nonEmptyString(name('operation'), options.operation, context)
  const requestHeaders =
    options.requestHeaders === undefined
      ? []
      : headerNames(name('requestHeaders'), options.requestHeaders, context).map((header) =>
          header.toLowerCase(),
        )
  for (const header of requestHeaders) {
    if (SECRET_HEADERS.has(header)) {
      throw new TypeError(`Expected ${optionName(name('requestHeaders'), context)} not to contain ${header}.`)
    }
  }
  if (options.wait !== undefined) {
    const wait = objectOption(name('wait'), options.wait, context)
    positiveInteger(name('wait.timeoutMs'), wait.timeoutMs, context)
  }
  const fingerprint =
    options.fingerprint === undefined ? {} : objectOption(name('fingerprint'), options.fingerprint, context)
  const include =
    fingerprint.include === undefined
      ? undefined
      : stringArray(name('fingerprint.include'), fingerprint.include, context)
  const exclude =
    fingerprint.exclude === undefined
      ? undefined
      : stringArray(name('fingerprint.exclude'), fingerprint.exclude, context)
  return {
    required: optionalBoolean(name('required'), options.required, true, context),
    operation: options.operation,
    leaseMs: optionalInt('leaseMs'),
    retentionMs: optionalInt('retentionMs'),
    include,
    exclude: exclude && exclude.length > 0 ? new Set(exclude) : undefined,
    query: optionalBoolean(name('fingerprint.query'), fingerprint.query, false, context),
    wait: options.wait,
    failOpen,
    classify: optionalFunction(name('classify'), options.classify, context),
    renderError: optionalFunction(name('renderError'), options.renderError, context),
    requestHeaders,
    maxBodyBytes: optionalInt('maxBodyBytes'),
  }
}

/** Where an adapter reports what goes wrong: pino's (and so Fastify's) signature, which `console` also accepts. */
export interface AdapterLogger {
  error(details: Record<string, unknown>, message: string): void
  info?(details: Record<string, unknown>, message: string): void
}

/** The default logger of adapters whose framework has none: errors to `console.error`, nothing else. */
export const consoleLogger: AdapterLogger = {
  error: (details, message) => console.error(message, details),
}

/**
 * The options every adapter takes: the engine and how to find the tenant of a request. `Tx` is the transaction type
 * of the engine's datasource (`pg.PoolClient` for a node-postgres pool), which the route's handler gets as `ctx.tx`.
 */
export interface AdapterOptions<Request, Args extends unknown[] = [], Tx = pg.PoolClient> {
  /**
   * The engine from `createEngine()`, over any datasource: its transaction type becomes the type of `ctx.tx`.
   * @example
   * engine: createEngine({ store: postgresStore({ pool }) })
   */
  engine: Engine<Tx>
  /**
   * The scope of a request's keys: the tenant or user id from authentication, a non-empty string. Never read it
   * from a header the client controls, or one tenant can replay another's responses.
   * @example
   * tenant: (request) => request.user.accountId
   */
  tenant: (request: Request, ...args: Args) => string | Promise<string>
}

/** The options of an adapter whose framework has no logger of its own (Express, the Fetch API). */
export interface StandaloneAdapterOptions<Request, Args extends unknown[] = [], Tx = pg.PoolClient>
  extends AdapterOptions<Request, Args, Tx> {
  /**
   * Where errors are logged: a store outage (once, with its cause and fix), a `tenant` function that returned no
   * tenant. Any pino-style logger (`logger.error(details, message)`); with `info`, one line per settled request.
   * @default console.error, errors only
   * @example
   * logger: pino()
   */
  logger?: AdapterLogger
}

/**
 * Reads the arguments of an adapter's `idempotent(handler)` or `idempotent(options, handler)` and validates the
 * options, naming them as options of `idempotent()`.
 */
export function routeArguments<Options extends IdempotencyRouteOptions, Handler>(
  optionsOrHandler: Options | Handler,
  maybeHandler: Handler | undefined,
): { handler: Handler; options: Options | undefined; route: ResolvedRoute } {
  const handler = typeof optionsOrHandler === 'function' ? optionsOrHandler : maybeHandler
  const options = typeof optionsOrHandler === 'function' ? undefined : (optionsOrHandler as Options)
  if (typeof handler !== 'function') {
    throw new TypeError('Expected a route handler: `idempotent(handler)` or `idempotent(options, handler)`.')
  }
  return {
    handler,
    options,
    route: resolveRoute(options, { of: '`idempotent()`' }),
  }
}

/** Checks the options every adapter shares, naming the adapter and the bad option. */
export function checkAdapterOptions(
  options: AdapterOptions<never, never, unknown> & { logger?: AdapterLogger },
  adapter: string,
  loggerHint?: string,
): void {
  objectOptions(adapter, options, { hint: 'It takes `engine` and `tenant`.' })
  engineOption('engine', options.engine, { of: adapter })
  requiredFunction('tenant', options.tenant, {
    of: adapter,
    hint: 'It gets the request and returns the tenant id.',
  })
  optionalLogger('logger', options.logger, { of: adapter, hint: loggerHint })
}
