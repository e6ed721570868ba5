import type pg from 'pg'
import { positiveInteger } from '../engine/options.js'
import type { Engine, ErrorClass, HandlerResponse } from '../engine/types.js'

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
 * Names an option in an error message, which wraps the name in backticks: `config.idempotency.leaseMs`, or
 * ``config.idempotency.leaseMs\` of route \`POST /x`` to say where. Without an option, names the options themselves.
 */
export type OptionNamer = (option?: string) => string

/** Validates a route's options when the route is set up, with a TypeError that names the bad option. */
export function resolveRoute(
  raw: true | IdempotencyRouteOptions | undefined,
  name: OptionNamer,
): ResolvedRoute {
  const options: IdempotencyRouteOptions = raw === true || raw === undefined ? {} : raw
  if (typeof options !== 'object' || options === null) {
    throw new TypeError(`Expected \`${name()}\` to be true or an object.`)
  }
  const optionalInt = (option: 'leaseMs' | 'retentionMs' | 'maxBodyBytes') =>
    options[option] === undefined ? undefined : positiveInteger(name(option), options[option])
  const optionalFunction = <T>(option: 'classify' | 'renderError', value: T | undefined): T | undefined => {
    if (value !== undefined && typeof value !== 'function') {
      throw new TypeError(`Expected \`${name(option)}\` to be a function.`)
    }
    return value
  }
  if (options.failOpen && !options.naturallyIdempotent) {
    throw new TypeError(
      `Expected \`${name('failOpen')}\` to be used only with \`naturallyIdempotent: true\`; failing open on a route that is not naturally idempotent duplicates effects.`,
    )
  }
  if (
    options.operation !== undefined &&
    (typeof options.operation !== 'string' || options.operation === '')
  ) {
    throw new TypeError(`Expected \`${name('operation')}\` to be a non-empty string.`)
  }
  const requestHeaders = (options.requestHeaders ?? []).map((header) => String(header).toLowerCase())
  for (const header of requestHeaders) {
    if (SECRET_HEADERS.has(header)) {
      throw new TypeError(`Expected \`${name('requestHeaders')}\` not to contain ${header}.`)
    }
  }
  if (options.wait !== undefined) positiveInteger(name('wait.timeoutMs'), options.wait?.timeoutMs)
  const exclude = options.fingerprint?.exclude
  return {
    required: options.required ?? true,
    operation: options.operation,
    leaseMs: optionalInt('leaseMs'),
    retentionMs: optionalInt('retentionMs'),
    include: options.fingerprint?.include,
    exclude: exclude && exclude.length > 0 ? new Set(exclude) : undefined,
    query: options.fingerprint?.query ?? false,
    wait: options.wait,
    failOpen: options.failOpen ?? false,
    classify: optionalFunction('classify', options.classify),
    renderError: optionalFunction('renderError', options.renderError),
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
    route: resolveRoute(options, (option) => `${option ?? 'options'}\` of \`idempotent()`),
  }
}

/** Checks the options every adapter shares, naming the adapter and the bad option. */
export function checkAdapterOptions(options: AdapterOptions<never, never, unknown>, adapter: string): void {
  if (typeof options !== 'object' || options === null) {
    throw new TypeError(`Expected the options of ${adapter} to be an object with \`engine\` and \`tenant\`.`)
  }
  if (typeof options.engine?.execute !== 'function' || typeof options.engine.verify !== 'function') {
    throw new TypeError(`Expected \`engine\` of ${adapter} to be an engine from createEngine().`)
  }
  if (typeof options.tenant !== 'function') {
    throw new TypeError(
      `Expected \`tenant\` of ${adapter} to be a function of the request that returns the tenant id.`,
    )
  }
}
