// `@oncely/client/otel`: OpenTelemetry traces and metrics for the client. Depends on `@opentelemetry/api` only (an
// optional peer dependency); the main entries never load this module. Built on the client's public surface: its
// events (`client.on`), its `fetch` option (one call per attempt) and `onIntent`.
import {
  context,
  type MeterProvider,
  metrics,
  type ObservableResult,
  type TracerProvider,
  trace,
} from '@opentelemetry/api'
import type { OncelyClient } from '../client.js'
import { mutationOf } from '../mutation.js'
import type { ClientOptions } from '../options.js'
import type { RequestOptions } from '../request.js'
import type { OncelyResponse } from '../response.js'
import { INSTRUMENTATION_NAME, instrumentsFor } from './instruments.js'
import { IntentSpans, type IntentState, now, recordError } from './spans.js'
import { VERSION } from './version.js'

export { INSTRUMENTATION_NAME } from './instruments.js'
export { VERSION } from './version.js'

/** Options of {@link instrumentClient}'s telemetry. */
export interface ClientTelemetryOptions {
  /**
   * Where spans go.
   * @default the global tracer provider (`trace.getTracerProvider()`, set by the OpenTelemetry SDK)
   * @example new WebTracerProvider({ spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter())] })
   */
  tracerProvider?: TracerProvider
  /**
   * Where metrics go.
   * @default the global meter provider (`metrics.getMeterProvider()`)
   * @example new MeterProvider({ readers: [new PeriodicExportingMetricReader({ exporter })] })
   */
  meterProvider?: MeterProvider
  /**
   * Records the idempotency key (`oncely.key`) and the intent id (`oncely.intent.id`) on spans. Never on metrics.
   * @default false
   */
  recordKey?: boolean
}

/**
 * Creates a client (with the `createClient` you pass, so the browser and Node entries keep their own default
 * stores) and instruments it: a span per intent (`oncely.intent POST`, a child of the span active when `request`
 * was called) with one client span per attempt, each attempt sending its own W3C `traceparent` so the server's
 * spans join the trace; metrics for attempts, retries by reason, Retry-After waits, resumes, intents by outcome,
 * pending intents and the write-ahead's duration. Register the OpenTelemetry SDK first. With no SDK registered it
 * records nothing, and the client behaves exactly as the one `createClient` returns.
 *
 * @example
 * import { createClient } from '@oncely/client'
 * import { instrumentClient } from '@oncely/client/otel'
 * const client = instrumentClient(createClient, { baseUrl: 'https://api.example.com' })
 */
export function instrumentClient(
  create: (options: ClientOptions) => OncelyClient,
  options: ClientOptions,
  telemetry: ClientTelemetryOptions = {},
): OncelyClient {
  if (typeof create !== 'function') throw new TypeError('Expected `create` to be createClient.')
  if (typeof options !== 'object' || options === null)
    throw new TypeError('Expected `options` to be an object.')
  if (typeof telemetry !== 'object' || telemetry === null)
    throw new TypeError('Expected `telemetry` to be an object.')
  if (telemetry.recordKey !== undefined && typeof telemetry.recordKey !== 'boolean')
    throw new TypeError('Expected `recordKey` to be a boolean.')
  const tracerProvider = telemetry.tracerProvider ?? trace.getTracerProvider()
  const meter = instrumentsFor(telemetry.meterProvider ?? metrics.getMeterProvider())
  const tracer = tracerProvider.getTracer(INSTRUMENTATION_NAME, VERSION)
  const spans = new IntentSpans(tracer, meter, telemetry.recordKey === true)
  const send: typeof fetch = (input, init) => (options.fetch ?? globalThis.fetch)(input, init)
  const client = create({ ...options, fetch: spans.tracedFetch(send) })
  spans.listen(client)

  const observePending = async (result: ObservableResult) => {
    const pending = await client.pending()
    result.observe(pending.filter((p) => p.state === 'pending').length, { 'oncely.intent.state': 'pending' })
    result.observe(pending.filter((p) => p.state === 'expired').length, { 'oncely.intent.state': 'expired' })
  }
  meter.pending.addCallback(observePending)
  const request = tracedRequest(spans, client)

  return {
    ...client,
    request: request as OncelyClient['request'],
    mutation: mutationOf(request),
    async close() {
      meter.pending.removeCallback(observePending)
      for (const state of [...spans.byId.values()]) spans.close(state)
      await client.close()
    },
  }
}

// `client.request` in a span of its own (the intent's, once the client named the intent), a child of the span
// active when it was called.
function tracedRequest(spans: IntentSpans, client: OncelyClient) {
  return <T>(req: RequestOptions): Promise<OncelyResponse<T>> => {
    const startedAt = now()
    const parent = context.active()
    const method = (req?.method ?? 'POST').toUpperCase()
    const span = spans.intentSpan(method, parent, false)
    const ctx = trace.setSpan(parent, span)
    let state: IntentState | undefined
    const onIntent = (intent: { id: string; key: string }) => {
      // A second call for a named intent in flight joins the first: its span stays empty and says so.
      if (spans.byId.has(intent.id)) span.setAttribute('oncely.intent.joined', true)
      else state = spans.open(intent.id, intent.key, span, ctx, true, startedAt)
      req.onIntent?.(intent)
    }
    const settle = () => {
      if (state) spans.close(state)
      else span.end()
    }
    return context
      .with(ctx, () => client.request<T>({ ...req, onIntent }))
      .then(
        (response) => {
          if (span.isRecording() && response.source === 'store') {
            span.setAttribute('oncely.source', 'store')
            span.setAttribute('http.response.status_code', response.status)
          }
          settle()
          return response
        },
        (error: unknown) => {
          // A run that failed was recorded by its `failed` event; an abort or a refusal before sending was not.
          if (!spans.failed.has(span)) recordError(span, error)
          settle()
          throw error
        },
      )
  }
}
