import {
  type Attributes,
  type Counter,
  type Histogram,
  type Meter,
  type MeterProvider,
  metrics,
  type ObservableGauge,
  type Tracer,
  type TracerProvider,
  trace,
  type UpDownCounter,
} from '@opentelemetry/api'
import { hasMethods, objectOptions, optionalBoolean } from '../options/check.js'
import { VERSION } from './version.js'

/** The instrumentation scope: tracers and meters are named after the package and its version. */
export const INSTRUMENTATION_NAME = '@oncely/server'

/** Options shared by `instrumentEngine` and `instrumentDispatcher`. */
export interface ServerTelemetryOptions {
  /**
   * Where spans go.
   * @default the global tracer provider (`trace.getTracerProvider()`, set by the OpenTelemetry SDK)
   * @example new NodeTracerProvider({ spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter())] })
   */
  tracerProvider?: TracerProvider
  /**
   * Where metrics go.
   * @default the global meter provider (`metrics.getMeterProvider()`, set by the OpenTelemetry SDK)
   * @example new MeterProvider({ readers: [new PrometheusExporter({ preventServerStart: true })] })
   */
  meterProvider?: MeterProvider
  /**
   * Records the tenant (the key's scope) as `oncely.scope` on spans and metrics. Every tenant then becomes a time
   * series of its own: turn it on only when tenants are few.
   * @default false
   */
  recordScope?: boolean
  /**
   * Records the idempotency key (`oncely.key`) and, for inbox deliveries, the message id (`messaging.message.id`) on
   * spans. Never on metrics.
   * @default false
   */
  recordKey?: boolean
}

/** Every instrument of the server, created once per meter provider. */
export interface ServerInstruments {
  requests: Counter
  requestDuration: Histogram
  duplicateWait: Histogram
  takeovers: Counter
  activeExecutions: UpDownCounter
  storeErrors: Counter
  reaperDeleted: Histogram
  reaperDuration: Histogram
  outboxMessages: Counter
  outboxPublishDuration: Histogram
  outboxLag: ObservableGauge
  inboxMessages: Counter
}

/** A resolved telemetry: the tracer, the instruments and the attribute choices. */
export interface ServerTelemetry {
  tracer: Tracer
  meter: Meter
  instruments: ServerInstruments
  recordScope: boolean
  recordKey: boolean
}

// Seconds, from a millisecond up: the handler's transaction, a replay from the cache, a bounded wait.
const DURATION_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
const ROW_BUCKETS = [0, 1, 10, 100, 1_000, 10_000, 100_000]

function createInstruments(meter: Meter): ServerInstruments {
  const seconds = (name: string, description: string, buckets = DURATION_BUCKETS) =>
    meter.createHistogram(name, { description, unit: 's', advice: { explicitBucketBoundaries: buckets } })
  const count = (name: string, unit: string, description: string) =>
    meter.createCounter(name, { description, unit })
  return {
    requests: count(
      'oncely.server.requests',
      '{request}',
      'Idempotent requests (engine executions) by outcome: executed, replayed, mismatch, in_progress, fenced_out, unavailable, failed_retryable, failed_permanent.',
    ),
    requestDuration: seconds(
      'oncely.server.request.duration',
      'Time from the start of an idempotent execution to its outcome, handler and commit included.',
    ),
    duplicateWait: seconds(
      'oncely.server.duplicate.wait.duration',
      'Time a request that asked to wait for an attempt in flight (`wait`) spent before its answer, when it did not run the handler itself.',
    ),
    takeovers: count(
      'oncely.server.takeovers',
      '{takeover}',
      "Attempts that took over a key whose earlier attempt's lease ran out.",
    ),
    activeExecutions: meter.createUpDownCounter('oncely.server.active_executions', {
      description: 'Keys this process holds in progress: reserved, handler running or completing.',
      unit: '{execution}',
    }),
    storeErrors: count(
      'oncely.server.store.errors',
      '{error}',
      'Errors of the idempotency store, by kind (`error.type`: the SQLSTATE or system error code).',
    ),
    reaperDeleted: meter.createHistogram('oncely.server.reaper.deleted', {
      description: 'Expired key records deleted by one reaper run.',
      unit: '{row}',
      advice: { explicitBucketBoundaries: ROW_BUCKETS },
    }),
    reaperDuration: seconds('oncely.server.reaper.duration', 'Duration of one reaper run.'),
    outboxMessages: count(
      'oncely.server.outbox.messages',
      '{message}',
      'Outbox publish attempts by result (`oncely.outbox.result`): published, retried (failed, will be retried), dead (failed for the last time), lease_lost.',
    ),
    outboxPublishDuration: seconds(
      'oncely.server.outbox.publish.duration',
      'Duration of one call of the outbox publisher.',
    ),
    outboxLag: meter.createObservableGauge('oncely.server.outbox.lag', {
      description: 'Age of the oldest unpublished (pending) outbox message; 0 when none is pending.',
      unit: 's',
    }),
    inboxMessages: count(
      'oncely.server.inbox.messages',
      '{message}',
      'Inbox deliveries by result (`oncely.inbox.result`): processed, duplicate (skipped), rejected, busy, failed, unavailable, mismatch.',
    ),
  }
}

const byMeterProvider = new WeakMap<MeterProvider, { meter: Meter; instruments: ServerInstruments }>()

/**
 * Resolves the telemetry options given to `factory` (named in errors): one tracer, one meter and one set of
 * instruments per provider, created on first use.
 */
export function resolveTelemetry(options: ServerTelemetryOptions, factory: string): ServerTelemetry {
  objectOptions(factory, options)
  const tracerProvider = options.tracerProvider ?? trace.getTracerProvider()
  const meterProvider = options.meterProvider ?? metrics.getMeterProvider()
  hasMethods('tracerProvider', tracerProvider, ['getTracer'], 'an OpenTelemetry TracerProvider')
  hasMethods('meterProvider', meterProvider, ['getMeter'], 'an OpenTelemetry MeterProvider')
  const recordScope = optionalBoolean('recordScope', options.recordScope, false)
  const recordKey = optionalBoolean('recordKey', options.recordKey, false)
  let resolved = byMeterProvider.get(meterProvider)
  if (!resolved) {
    const meter = meterProvider.getMeter(INSTRUMENTATION_NAME, VERSION)
    resolved = { meter, instruments: createInstruments(meter) }
    byMeterProvider.set(meterProvider, resolved)
  }
  return {
    tracer: tracerProvider.getTracer(INSTRUMENTATION_NAME, VERSION),
    meter: resolved.meter,
    instruments: resolved.instruments,
    recordScope,
    recordKey,
  }
}

/**
 * A low-cardinality name for an error: the SQLSTATE or system error code (`57P01`, `ECONNREFUSED`) when it has one,
 * else its class name.
 */
export function errorType(error: unknown): string {
  const code = (error as { code?: unknown } | null)?.code
  if (typeof code === 'string' && code !== '' && code.length <= 32) return code
  if (error instanceof Error) return error.name
  return '_OTHER'
}

/** Attribute sets reused across records (the SDK hashes every set it is given), bounded in number. */
export class AttributeCache {
  readonly #sets = new Map<string, Attributes>()
  constructor(readonly limit = 2_000) {}

  get(key: string, build: () => Attributes): Attributes {
    let found = this.#sets.get(key)
    if (found) return found
    found = Object.freeze(build())
    if (this.#sets.size < this.limit) this.#sets.set(key, found)
    return found
  }
}
