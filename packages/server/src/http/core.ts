import { parseIdempotencyKey, problem } from '@oncely/protocol'
import { recordIdProblem } from '../engine/options.js'
import type { Engine, ExecuteInput, ExecutionContext, HandlerResponse, Outcome } from '../engine/types.js'
import { isStoreSetupError } from '../errors.js'
import { type Answer, answerFor, misconfiguredAnswer, problemAnswer } from './answer.js'
import type { HoldSettlement } from './held.js'
import type { AdapterLogger, ResolvedRoute } from './options.js'
import { fingerprintOf, type HeaderReader, storedRequestHeaders } from './request.js'

/**
 * One request as an adapter presents it to the core, after its body was read and parsed. `Tx` is the transaction
 * type of the engine's datasource, handed to the route's handler as `ctx.tx`.
 */
export interface Exchange<Tx = unknown> {
  /** Upper-case. */
  method: string
  /** The route template, such as `/v1/orders/:id`. */
  route: string
  /**
   * The request's path, decoded as the router matched it (see `decodePath`), with its parameter values, such as
   * `/v1/orders/42`: part of the fingerprint, so the same key on another resource is a mismatch.
   */
  path: string
  /** A request header by its lower-case name. */
  header(name: string): ReturnType<HeaderReader>
  /** The strictly parsed JSON body, `undefined` without one. */
  body: unknown
  /** The parsed query string; read only when the route fingerprints it. */
  query(): Record<string, unknown> | undefined
  /** Calls the adapter's `tenant` option on the framework's request. */
  tenant(): unknown
  /** Runs the route's handler with the context and resolves with its response once it answered. */
  run(ctx: ExecutionContext<Tx>): Promise<HandlerResponse>
  log: AdapterLogger
  /**
   * The request's held response (see `HeldResponse`): once the handler sent through it, the answer (or the error)
   * goes there and `handle` resolves `undefined`.
   */
  held?: HoldSettlement
}

/** The verdict on an optional route called without a key: run the handler without the layer. */
export const PASS = Symbol('oncely.pass')

/** What the adapter does with a request the core looked at: send the answer, or run the handler without the layer. */
export type Verdict = Answer | typeof PASS

/** The per-adapter half of the layer: the engine, the tenant resolution and what is worth an error log. */
export interface HttpCore<Tx = unknown> {
  /**
   * Parses the key, resolves the tenant, fingerprints the request and runs it through the engine; resolves with the
   * answer for the client, `PASS` when an optional route got no key (run the handler without the layer), or
   * `undefined` when the answer went to the handler's held send.
   */
  handle(
    route: ResolvedRoute,
    exchange: Exchange<Tx> & { held: HoldSettlement },
  ): Promise<Verdict | undefined>
  handle(route: ResolvedRoute, exchange: Exchange<Tx> & { held?: undefined }): Promise<Verdict>
}

export function createHttpCore<Tx>(engine: Engine<Tx>, adapter: string): HttpCore<Tx> {
  // True from the first `unavailable` outcome until a request gets through again: one error log per outage, with
  // its cause, instead of one per request (or none, which is how a missing migration used to look).
  let outage = false
  // Mistakes in the server's setup are logged once each (they hold for every request until a deploy fixes them).
  const reported = new Set<string>()
  const misconfigured = (
    log: AdapterLogger,
    what: string,
    fields: Record<string, unknown>,
    message: string,
    detail = 'The server could not tell whose request this is.',
  ): Answer => {
    if (!reported.has(what)) {
      reported.add(what)
      log.error(fields, message)
    }
    return misconfiguredAnswer(detail)
  }

  function reportUnavailable(error: unknown, log: AdapterLogger): void {
    if (outage) return
    outage = true
    const report = (cause: unknown) =>
      log.error(
        { err: cause },
        `oncely: the idempotency store failed, so idempotent requests get 503 until it recovers: ${messageOf(cause)}`,
      )
    // Ask the engine whether the store is set up at all: if not, its error names the table and the migration.
    engine.verify().then(
      () => report(error),
      (setup) => report(isStoreSetupError(setup) ? setup : error),
    )
  }

  async function handle(route: ResolvedRoute, exchange: Exchange<Tx>): Promise<Verdict | undefined> {
    const { held } = exchange
    if (!held) return decide(route, exchange)
    let verdict: Verdict
    try {
      verdict = await decide(route, exchange)
    } catch (error) {
      if (held.settleError(error)) return undefined
      throw error
    }
    // PASS never reaches a held send: an optional route without a key runs no handler here.
    return held.settle(verdict as Answer) ? undefined : verdict
  }

  async function decide(route: ResolvedRoute, exchange: Exchange<Tx>): Promise<Verdict> {
    const parsed = parseIdempotencyKey(exchange.header('idempotency-key'))
    if (!parsed.ok) {
      if (parsed.code === 'idempotency_key_missing' && !route.required) return PASS
      exchange.log.info?.({ idempotencyKeyError: parsed.code }, 'oncely: rejected idempotency key')
      return problemAnswer(problem(parsed.code, parsed.detail))
    }
    const key = parsed.key
    // Awaited only when the tenant function is async: awaiting a plain value still costs a promise and a tick.
    const tenant = exchange.tenant()
    const scope = isThenable(tenant) ? await tenant : tenant
    if (typeof scope !== 'string' || scope === '') {
      return misconfigured(
        exchange.log,
        'tenant',
        { tenant: scope === '' ? '' : typeof scope },
        `oncely: the \`tenant\` function of ${adapter} returned ${scope === '' ? 'an empty string' : String(scope)} instead of the tenant id; return a non-empty string (the tenant or user id from authentication), and reject unauthenticated requests before this route.`,
      )
    }
    const operation = route.operation ?? `${exchange.method} ${exchange.route}`
    const tooLong = recordIdProblem({ scope, operation, key })
    if (tooLong) {
      return misconfigured(
        exchange.log,
        'length',
        { operation },
        `oncely: ${adapter} cannot key this request: ${tooLong} Return a shorter tenant id from \`tenant\` (an id, not a name or a token), or set a shorter \`operation\` on the route.`,
        'The server could not key this request.',
      )
    }
    let responded = false
    const input: ExecuteInput<Tx> = {
      scope,
      operation,
      key,
      fingerprint: fingerprintOf(route, exchange),
      handler: async (ctx) => {
        const response = await exchange.run(ctx)
        responded = true
        return response
      },
    }
    const requestHeaders = storedRequestHeaders(route, exchange)
    if (requestHeaders) input.requestHeaders = requestHeaders
    if (route.classify) input.classify = route.classify
    if (route.renderError) input.renderError = route.renderError
    if (route.wait) input.wait = route.wait
    if (route.failOpen) input.failOpen = true
    if (route.leaseMs) input.leaseMs = route.leaseMs
    if (route.retentionMs) input.retentionMs = route.retentionMs

    const outcome: Outcome = await engine.execute(input)
    exchange.log.info?.(
      { idempotencyKey: key, scope, operation, outcome: outcome.kind },
      'oncely: request settled',
    )
    if (outcome.kind === 'unavailable') reportUnavailable(outcome.error, exchange.log)
    else outage = false
    logTrouble(exchange.log, outcome, { idempotencyKey: key, scope, operation })
    return answerFor(outcome, responded)
  }

  return { handle } as HttpCore
}

/** The error logs of an outcome that needs the operator: a lost lease, a response too large to store. */
function logTrouble(
  log: AdapterLogger,
  outcome: Outcome,
  id: { idempotencyKey: string; scope: string; operation: string },
): void {
  const { operation } = id
  if (outcome.kind === 'lease_expired') {
    log.error(
      { ...id, attempt: outcome.attempt, leaseMs: outcome.leaseMs },
      `oncely: attempt ${outcome.attempt} of a ${operation} request lost its key before it finished, so nothing it wrote was committed and the client was told to retry: the process stalled (paused, its event loop blocked or starved of CPU) for longer than leaseMs (${outcome.leaseMs} ms), since a live handler renews its lease while it runs. Raise leaseMs above the longest stall to tolerate.`,
    )
  } else if (outcome.kind === 'executed' && outcome.tooLarge) {
    log.error(
      { ...id, size: outcome.tooLarge.size, maxResponseBytes: outcome.tooLarge.limit },
      `oncely: a ${operation} response of ${outcome.tooLarge.size} bytes exceeds maxResponseBytes (${outcome.tooLarge.limit}), so its writes were rolled back and the key answers response_too_large until it expires. Raise maxResponseBytes (createEngine), then engine.forget() the key to let its client retry.`,
    )
  }
}

const isThenable = (value: unknown): value is PromiseLike<unknown> =>
  typeof (value as PromiseLike<unknown> | null)?.then === 'function'

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error)
}
