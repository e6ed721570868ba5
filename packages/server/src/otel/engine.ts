import { performance } from 'node:perf_hooks'
import {
  type Attributes,
  type Context,
  context,
  createContextKey,
  propagation,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  trace,
} from '@opentelemetry/api'
import type { Engine, ExecuteInput, Outcome } from '../engine/types.js'
import {
  ENGINE_SIGNALS,
  type EngineSignal,
  INBOX_DELIVERY,
  type InboxDelivery,
  type MarkedInput,
  type Observable,
  wrapEngine,
} from '../hooks.js'
import { engineOption } from '../options/check.js'
import {
  AttributeCache,
  errorType,
  resolveTelemetry,
  type ServerTelemetry,
  type ServerTelemetryOptions,
} from './telemetry.js'

/** Span and metric attribute names of oncely's own (the others are OpenTelemetry's semantic conventions). */
export const ATTR_OUTCOME = 'oncely.outcome'
export const ATTR_OPERATION = 'oncely.operation'
export const ATTR_PROTOCOL = 'oncely.protocol'
export const ATTR_SCOPE = 'oncely.scope'
export const ATTR_KEY = 'oncely.key'
export const ATTR_ATTEMPT = 'oncely.attempt'
export const ATTR_REPLAYED = 'oncely.replayed'
export const ATTR_INBOX_RESULT = 'oncely.inbox.result'

/** What an idempotent request came to, as the `oncely.outcome` attribute says it. */
export type OutcomeName =
  | 'executed'
  | 'replayed'
  | 'mismatch'
  | 'in_progress'
  | 'fenced_out'
  | 'lease_expired'
  | 'unavailable'
  | 'failed_retryable'
  | 'failed_permanent'

/** The `oncely.outcome` of an engine outcome. A fenced-out attempt is `fenced_out` whatever it answered. */
export function outcomeName(outcome: Outcome): OutcomeName {
  switch (outcome.kind) {
    case 'executed':
      return outcome.status === 'failed_permanent' ? 'failed_permanent' : 'executed'
    case 'replayed':
      return outcome.fencedOut ? 'fenced_out' : 'replayed'
    case 'in_progress':
      return 'in_progress'
    case 'lease_expired':
      return 'lease_expired'
    case 'mismatch':
      return 'mismatch'
    case 'unavailable':
      return 'unavailable'
    case 'retryable_failure':
      return 'failed_retryable'
  }
}

/** What an inbox tells its broker for an outcome (`ConsumeResult.kind`), as `oncely.inbox.result`. */
function inboxResult(outcome: Outcome): string {
  switch (outcome.kind) {
    case 'executed':
    case 'replayed':
      if (outcome.response.status >= 400) return 'rejected'
      return outcome.kind === 'executed' ? 'processed' : 'duplicate'
    case 'in_progress':
      return 'busy'
    case 'mismatch':
      return 'mismatch'
    case 'unavailable':
      return 'unavailable'
    case 'lease_expired':
    case 'retryable_failure':
      return 'failed'
  }
}

/** One execution in flight, found again by the engine's signals through the active context. */
interface Execution {
  input: ExecuteInput
  span: Span
  /** True once the handler was called: this request holds the key. */
  holding: boolean
}

const EXECUTION = createContextKey('oncely.server.execution')

/** The context a delivery's span starts in: the message's trace, unless the active span already belongs to it. */
function deliveryParent(delivery: InboxDelivery): { parent: Context; link?: Span } {
  const active = context.active()
  if (!delivery.headers) return { parent: active }
  const extracted = propagation.extract(ROOT_CONTEXT, delivery.headers)
  const remote = trace.getSpanContext(extracted)
  if (!remote || !trace.isSpanContextValid(remote)) return { parent: active }
  const current = trace.getSpan(active)
  const currentContext = current?.spanContext()
  if (currentContext && currentContext.traceId === remote.traceId) return { parent: active }
  return current ? { parent: extracted, link: current } : { parent: extracted }
}

/**
 * Instruments an engine, and through it every adapter that runs on it (Fastify, Express, Fetch, the inbox, the
 * webhook receiver, jobs, steps): a span per execution (a child of the active span, such as the incoming HTTP
 * request's when HTTP instrumentation is on), request, duration, takeover, in-progress, store-error and reaper
 * metrics (pass `traceHeaders()` to `enqueue()` to carry the execution's trace into an outbox message). Returns
 * a new engine; the one given keeps working uninstrumented. Create the OpenTelemetry SDK first: the tracer and meter are taken when this is called.
 *
 * The span and instruments record nothing (and cost next to nothing) when no SDK is registered. Outcomes, errors
 * and timing are never changed: every recording is guarded, and the handler runs exactly as before.
 *
 * @example
 * import { instrumentEngine } from '@oncely/server/otel'
 * const engine = instrumentEngine(createEngine({ store: postgresStore({ pool }) }))
 * await app.register(fastifyIdempotency, { engine, tenant: (request) => request.user.tenantId })
 */
export function instrumentEngine(engine: Engine, options: ServerTelemetryOptions = {}): Engine {
  engineOption('engine', engine)
  const telemetry = resolveTelemetry(options, 'instrumentEngine()')
  const { tracer, instruments, recordScope } = telemetry
  const protocol = engine.options.reservation
  const attributes = new AttributeCache()

  /** Metric attributes: operation, protocol, outcome (and the scope only when asked). */
  const metricAttributes = (input: ExecuteInput, outcome: string | undefined): Attributes => {
    if (recordScope) {
      return {
        [ATTR_OPERATION]: input.operation,
        [ATTR_PROTOCOL]: protocol,
        ...(outcome === undefined ? {} : { [ATTR_OUTCOME]: outcome }),
        [ATTR_SCOPE]: input.scope,
      }
    }
    return attributes.get(`${outcome ?? ''}\u0000${input.operation}`, () => ({
      [ATTR_OPERATION]: input.operation,
      [ATTR_PROTOCOL]: protocol,
      ...(outcome === undefined ? {} : { [ATTR_OUTCOME]: outcome }),
    }))
  }

  const observe = (engine as Observable)[ENGINE_SIGNALS]
  observe?.((signal) => onSignal(signal, telemetry, protocol))

  async function execute(input: ExecuteInput): Promise<Outcome> {
    const started = performance.now()
    const delivery = (input as MarkedInput)[INBOX_DELIVERY]
    const { parent, link } = delivery ? deliveryParent(delivery) : { parent: context.active() }
    const span = tracer.startSpan(
      delivery ? `process ${delivery.topic}` : `oncely ${input.operation}`,
      {
        kind: delivery ? SpanKind.CONSUMER : SpanKind.INTERNAL,
        attributes: spanAttributes(input, delivery, protocol, telemetry),
        ...(link ? { links: [{ context: link.spanContext() }] } : {}),
      },
      parent,
    )
    const recording = span.isRecording()
    const execution: Execution = { input, span, holding: false }
    const traced: ExecuteInput = {
      ...input,
      handler: async (ctx) => {
        execution.holding = true
        instruments.activeExecutions.add(1, metricAttributes(input, undefined))
        if (recording) span.addEvent('oncely.reserved', { [ATTR_ATTEMPT]: ctx.attempt })
        try {
          return await input.handler(ctx)
        } catch (error) {
          if (recording) span.recordException(error as Error)
          throw error
        } finally {
          if (recording) span.addEvent('oncely.handler.end')
        }
      },
    }
    // Without an SDK the span records nothing, and the context is left as it was.
    const active = recording ? trace.setSpan(parent, span).setValue(EXECUTION, execution) : parent
    let outcome: Outcome | undefined
    try {
      outcome = await context.with(active, engine.execute, engine, traced)
      return outcome
    } catch (error) {
      // The handler crashed the attempt (the engine rethrows what it cannot classify): record, never swallow.
      if (recording) {
        span.recordException(error as Error)
        span.setStatus({ code: SpanStatusCode.ERROR, message: messageOf(error) })
        span.setAttribute('error.type', errorType(error))
      }
      throw error
    } finally {
      try {
        const seconds = (performance.now() - started) / 1_000
        const name = outcome ? outcomeName(outcome) : 'failed_retryable'
        const counted = metricAttributes(input, name)
        instruments.requests.add(1, counted)
        instruments.requestDuration.record(seconds, counted)
        if (execution.holding) instruments.activeExecutions.add(-1, metricAttributes(input, undefined))
        else if (input.wait && (name === 'replayed' || name === 'in_progress' || name === 'mismatch')) {
          instruments.duplicateWait.record(seconds, counted)
        }
        if (delivery && outcome) {
          instruments.inboxMessages.add(1, {
            'messaging.destination.name': delivery.topic,
            'messaging.consumer.group.name': delivery.consumer,
            [ATTR_INBOX_RESULT]: inboxResult(outcome),
          })
        }
        if (recording) {
          if (outcome) endAttributes(span, outcome, name, delivery)
          else span.setAttribute(ATTR_OUTCOME, name)
        }
      } finally {
        span.end()
      }
    }
  }

  // reap() and startReaper() are the engine's own: their runs reach the metrics through the engine's signals.
  return wrapEngine(engine, { execute })
}

function spanAttributes(
  input: ExecuteInput,
  delivery: InboxDelivery | undefined,
  protocol: string,
  telemetry: ServerTelemetry,
): Attributes {
  const attributes: Attributes = { [ATTR_OPERATION]: input.operation, [ATTR_PROTOCOL]: protocol }
  if (telemetry.recordScope) attributes[ATTR_SCOPE] = input.scope
  if (telemetry.recordKey) attributes[ATTR_KEY] = input.key
  if (delivery) {
    attributes['messaging.operation.type'] = 'process'
    attributes['messaging.operation.name'] = 'process'
    attributes['messaging.destination.name'] = delivery.topic
    attributes['messaging.consumer.group.name'] = delivery.consumer
    if (telemetry.recordKey) attributes['messaging.message.id'] = delivery.messageId
  }
  return attributes
}

function endAttributes(span: Span, outcome: Outcome, name: OutcomeName, delivery: InboxDelivery | undefined) {
  span.setAttribute(ATTR_OUTCOME, name)
  // What the HTTP adapters send as `Idempotent-Replayed: true`.
  span.setAttribute(ATTR_REPLAYED, outcome.kind === 'replayed')
  if (delivery) span.setAttribute(ATTR_INBOX_RESULT, inboxResult(outcome))
  switch (outcome.kind) {
    case 'executed':
      span.setAttribute(ATTR_ATTEMPT, outcome.attempt)
      span.setAttribute('oncely.response.status_code', outcome.response.status)
      if (outcome.failedOpen) span.setAttribute('oncely.failed_open', true)
      break
    case 'replayed':
      span.setAttribute('oncely.response.status_code', outcome.response.status)
      break
    case 'in_progress':
      span.setAttribute('oncely.retry_after_ms', outcome.retryAfterMs)
      break
    case 'unavailable':
      span.setStatus({ code: SpanStatusCode.ERROR, message: messageOf(outcome.error) })
      span.setAttribute('error.type', errorType(outcome.error))
      break
    case 'lease_expired':
      span.setAttribute(ATTR_ATTEMPT, outcome.attempt)
      span.setStatus({
        code: SpanStatusCode.ERROR,
        message: `the attempt lost its lease (${outcome.leaseMs} ms)`,
      })
      span.setAttribute('error.type', 'lease_expired')
      break
    case 'retryable_failure':
      if (outcome.response) span.setAttribute('oncely.response.status_code', outcome.response.status)
      span.setStatus({
        code: SpanStatusCode.ERROR,
        message: outcome.error === undefined ? outcome.reason : messageOf(outcome.error),
      })
      span.setAttribute('error.type', outcome.error === undefined ? outcome.reason : errorType(outcome.error))
      break
    case 'mismatch':
      break
  }
}

/** The engine's signals: counters that no outcome shows, and span events on the execution they belong to. */
function onSignal(signal: EngineSignal, telemetry: ServerTelemetry, protocol: string): void {
  const { instruments, tracer } = telemetry
  if (signal.type === 'reaped') {
    const attributes: Attributes = { [ATTR_PROTOCOL]: protocol }
    if (signal.error !== undefined) attributes['error.type'] = errorType(signal.error)
    instruments.reaperDeleted.record(signal.deleted, attributes)
    instruments.reaperDuration.record(signal.durationMs / 1_000, attributes)
    const end = performance.timeOrigin + performance.now()
    const span = tracer.startSpan(
      'oncely reap',
      {
        startTime: end - signal.durationMs,
        attributes: { ...attributes, 'oncely.reaper.deleted': signal.deleted },
      },
      ROOT_CONTEXT,
    )
    if (signal.error !== undefined && span.isRecording()) {
      span.recordException(signal.error as Error)
      span.setStatus({ code: SpanStatusCode.ERROR, message: messageOf(signal.error) })
    }
    span.end(end)
    return
  }
  if (signal.type === 'store_error') {
    instruments.storeErrors.add(1, { 'error.type': errorType(signal.error), [ATTR_PROTOCOL]: protocol })
  } else if (signal.type === 'takeover') {
    const attributes: Attributes = { [ATTR_OPERATION]: signal.operation, [ATTR_PROTOCOL]: protocol }
    if (telemetry.recordScope) attributes[ATTR_SCOPE] = signal.scope
    instruments.takeovers.add(1, attributes)
  }
  // The execution this signal belongs to, when it runs in this process under this wrapper.
  const execution = context.active().getValue(EXECUTION) as Execution | undefined
  if (!execution?.span.isRecording()) return
  const { input, span } = execution
  if (signal.scope !== input.scope || signal.operation !== input.operation || signal.key !== input.key) return
  switch (signal.type) {
    case 'takeover':
    case 'fenced_out':
      span.addEvent(`oncely.${signal.type}`, { [ATTR_ATTEMPT]: signal.attempt })
      break
    case 'expired':
      span.addEvent('oncely.expired')
      break
    case 'released':
      span.addEvent('oncely.released', { [ATTR_ATTEMPT]: signal.attempt, 'oncely.reason': signal.reason })
      break
    case 'in_progress':
      span.addEvent('oncely.in_progress', { 'oncely.retry_after_ms': signal.retryAfterMs })
      break
    case 'store_error':
      span.addEvent('oncely.store_error', { 'error.type': errorType(signal.error) })
      break
    default:
      break
  }
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error)
}
