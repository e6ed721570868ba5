import { parseIdempotencyKey, problem } from '@oncely/protocol'
import { recordIdProblem } from '../engine/options.js'
import type { Engine, ExecuteInput, ExecutionContext, HandlerResponse, Outcome } from '../engine/types.js'
import { isStoreSetupError } from '../errors.js'
import { type Answer, answerFor, type HeaderSnapshot, misconfiguredAnswer, problemAnswer } from './answer.js'
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
  header: HeaderReader
  /** The strictly parsed JSON body, `undefined` without one. */
  body: unknown
  /** The parsed query string; read only when the route fingerprints it. */
  query: () => Record<string, unknown> | undefined
  /** Calls the adapter's `tenant` option on the framework's request. */
  tenant: () => unknown
  /** Runs the route's handler with the context and resolves with its response once it answered. */
  run: (ctx: ExecutionContext<Tx>) => Promise<HandlerResponse>
  log: AdapterLogger
  /**
   * Where the handler's intercepted send waits for the engine's decision, for adapters whose handlers write to a
   * response object. Once it sent, the answer (or the error) goes there and `handle` resolves `undefined`.
   */
  held?: HeldResponse
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
  handle(route: ResolvedRoute, exchange: Exchange<Tx> & { held: HeldResponse }): Promise<Verdict | undefined>
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
    try {
      const verdict = await decide(route, exchange)
      held.capturing = false
      if (!held.sent) return verdict
      held.decision.resolve(verdict as Answer)
      return undefined
    } catch (error) {
      held.capturing = false
      if (!held.sent) throw error
      held.decision.reject(error)
      return undefined
    }
  }

  async function decide(route: ResolvedRoute, exchange: Exchange<Tx>): Promise<Verdict> {
    const parsed = parseIdempotencyKey(exchange.header('idempotency-key'))
    if (!parsed.ok) {
      if (parsed.code === 'idempotency_key_missing' && !route.required) return PASS
      exchange.log.info?.({ idempotencyKeyError: parsed.code }, 'oncely: rejected idempotency key')
      return problemAnswer(problem(parsed.code, parsed.detail))
    }
    const key = parsed.key
    const scope = await exchange.tenant()
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
      fingerprint: fingerprintOf(route, exchange, exchange.query),
      handler: async (ctx) => {
        const response = await exchange.run(ctx)
        responded = true
        return response
      },
    }
    const requestHeaders = storedRequestHeaders(route, exchange.header)
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
    if (outcome.kind === 'lease_expired') {
      exchange.log.error(
        { idempotencyKey: key, scope, operation, attempt: outcome.attempt, leaseMs: outcome.leaseMs },
        `oncely: attempt ${outcome.attempt} of a ${operation} request lost its key before it finished, so nothing it wrote was committed and the client was told to retry: the process stalled (paused, its event loop blocked or starved of CPU) for longer than leaseMs (${outcome.leaseMs} ms), since a live handler renews its lease while it runs. Raise leaseMs above the longest stall to tolerate.`,
      )
    } else if (outcome.kind === 'executed' && outcome.tooLarge) {
      exchange.log.error(
        {
          idempotencyKey: key,
          scope,
          operation,
          size: outcome.tooLarge.size,
          maxResponseBytes: outcome.tooLarge.limit,
        },
        `oncely: a ${operation} response of ${outcome.tooLarge.size} bytes exceeds maxResponseBytes (${outcome.tooLarge.limit}), so its writes were rolled back and the key answers response_too_large until it expires. Raise maxResponseBytes (createEngine), then engine.forget() the key to let its client retry.`,
      )
    }
    return answerFor(outcome, responded)
  }

  return { handle } as HttpCore
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error)
}

interface Deferred<T> {
  promise: Promise<T>
  resolve(value: T): void
  reject(error: unknown): void
}

function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void
  let reject!: (error: unknown) => void
  const promise = new Promise<T>((res, rej) => {
    resolve = res
    reject = rej
  })
  // Either side may settle without the other listening (a handler that threw never sends).
  promise.catch(() => {})
  return { promise, resolve, reject }
}

/**
 * Holds a response between the handler's "send" and the wire, for frameworks whose handlers write to a response
 * object (Fastify's reply, Express's res). The adapter intercepts the send, hands the response to the engine
 * (`captured`) and waits for the engine's decision (`decision`): only once the key record and the business writes
 * are committed does a byte leave, so a crash after the commit replays the same response and a failed commit never
 * reaches the client as a 2xx. Pass it as `Exchange.held`.
 */
export class HeldResponse {
  /** True while the handler runs and its response has not been captured yet. */
  capturing = false
  /** True once the handler sent its response (now waiting in `decision`). */
  sent = false
  /** Created when the handler runs (a replay, a 409 or a 422 never needs them). */
  captured!: Deferred<HandlerResponse>
  decision!: Deferred<Answer>
  /**
   * The response's headers when the handler started (`undefined` until it runs): what an answer that replaces the
   * handler's response gives back, so none of the handler's own headers go out with it.
   */
  headersBefore: HeaderSnapshot | undefined

  /** @param snapshot takes the response's headers as they are now (see `snapshotHeaders`). */
  constructor(private readonly snapshot: () => HeaderSnapshot) {}

  /**
   * Runs the handler and resolves with its response once it sent one. A handler may resolve before it sends (a
   * callback answers later) or only after its response is written, which waits for the commit; so its promise is
   * raced against the capture instead of awaited. `returned` sees the value it resolved with.
   */
  async run(invoke: () => unknown, returned?: (value: unknown) => void): Promise<HandlerResponse> {
    this.captured = deferred()
    this.decision = deferred()
    this.headersBefore = this.snapshot()
    this.capturing = true
    const done = Promise.resolve(invoke()).then((value) => ({ value }))
    done.catch(() => {})
    const first = await Promise.race([done, this.captured.promise])
    if (!('value' in first)) return first
    if (!this.sent) returned?.(first.value)
    return this.captured.promise
  }
}
