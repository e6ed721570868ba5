// `@oncely/client/otel`: OpenTelemetry traces and metrics for the client. Depends on `@opentelemetry/api` only (an
// optional peer dependency); the main entries never load this module. Built on the client's public surface: its
// events (`client.on`), its `fetch` option (one call per attempt) and `onIntent`.
import { IDEMPOTENCY_KEY_HEADER } from '@oncely/protocol'
import {
  type Attributes,
  type Context,
  context,
  type MeterProvider,
  metrics,
  type ObservableResult,
  propagation,
  type Span,
  SpanKind,
  SpanStatusCode,
  type TracerProvider,
  trace,
} from '@opentelemetry/api'
import type { OncelyClient } from '../client.js'
import type { ClientOptions } from '../options.js'
import type { RequestOptions } from '../request.js'
import type { OncelyResponse } from '../response.js'
import { VERSION } from './version.js'

export { VERSION } from './version.js'

/** The instrumentation scope: the tracer and meter are named after the package and its version. */
export const INSTRUMENTATION_NAME = '@oncely/client'

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

const now = () => globalThis.performance?.now() ?? Date.now()

/** One intent being driven: its span, and the attempt in flight. */
interface IntentState {
  id: string
  key: string
  span: Span
  context: Context
  /** Ended by the `request()` call that opened it (else by the intent's last event). */
  owned: boolean
  /** When that call started, until the first attempt (the write-ahead is done by then). */
  startedAt: number | undefined
  attempt: { span: Span; context: Context } | undefined
}

function instrumentsOf(provider: MeterProvider) {
  const meter = provider.getMeter(INSTRUMENTATION_NAME, VERSION)
  const seconds = {
    unit: 's',
    advice: {
      explicitBucketBoundaries: [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
      ],
    },
  }
  return {
    attempts: meter.createCounter('oncely.client.attempts', {
      description: 'Attempts sent (each carries the same Idempotency-Key as the others of its intent).',
      unit: '{attempt}',
    }),
    retries: meter.createCounter('oncely.client.retries', {
      description: 'Retries scheduled, by reason (`oncely.retry.reason`: `status 503`, `network`, ...).',
      unit: '{retry}',
    }),
    retryDelay: meter.createHistogram('oncely.client.retry.delay', {
      description:
        'Waits before a retry; `oncely.retry_after` is true when the server set it with Retry-After (409, 429, 503).',
      ...seconds,
    }),
    intents: meter.createCounter('oncely.client.intents', {
      description:
        'Intents that ended a run, by outcome (`oncely.outcome`: settled, failed, pending, expired).',
      unit: '{intent}',
    }),
    resumes: meter.createCounter('oncely.client.resumes', {
      description: 'Pending intents that resume() brought to an outcome, by outcome (settled, failed).',
      unit: '{intent}',
    }),
    writeAhead: meter.createHistogram('oncely.client.write_ahead.duration', {
      description:
        'Time from a request() call to its first byte: the durable write-ahead of the intent (and, for a named intent, its claim and read).',
      ...seconds,
    }),
    pending: meter.createObservableGauge('oncely.client.intents.pending', {
      description: 'Intents in the store not confirmed yet (pending, or expired with an unknown outcome).',
      unit: '{intent}',
    }),
  }
}

const byMeterProvider = new WeakMap<MeterProvider, ReturnType<typeof instrumentsOf>>()

/** The header named `name` of a fetch call's init (the client passes a plain object). */
function headerOf(init: RequestInit | undefined, name: string): string | undefined {
  const headers = init?.headers
  if (!headers) return undefined
  if (headers instanceof Headers) return headers.get(name) ?? undefined
  if (Array.isArray(headers)) return headers.find(([k]) => k.toLowerCase() === name.toLowerCase())?.[1]
  const record = headers as Record<string, string>
  return record[name] ?? record[name.toLowerCase()]
}

function withHeaders(init: RequestInit | undefined, extra: Record<string, string>): RequestInit {
  const headers = new Headers(init?.headers)
  for (const [name, value] of Object.entries(extra)) headers.set(name, value)
  return { ...init, headers }
}

function errorType(error: unknown): string {
  return error instanceof Error ? error.name : '_OTHER'
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
  const meterProvider = telemetry.meterProvider ?? metrics.getMeterProvider()
  const tracer = tracerProvider.getTracer(INSTRUMENTATION_NAME, VERSION)
  let instruments = byMeterProvider.get(meterProvider)
  if (!instruments) {
    instruments = instrumentsOf(meterProvider)
    byMeterProvider.set(meterProvider, instruments)
  }
  const meter = instruments
  const recordKey = telemetry.recordKey === true
  const byId = new Map<string, IntentState>()
  const byKey = new Map<string, IntentState>()
  const failed = new WeakSet<Span>()

  const send: typeof fetch = (input, init) => (options.fetch ?? globalThis.fetch)(input, init)
  const tracedFetch: typeof fetch = async (input, init) => {
    const key = headerOf(init, IDEMPOTENCY_KEY_HEADER)
    const attempt = key === undefined ? undefined : byKey.get(key)?.attempt
    if (!attempt) return send(input, init)
    const carrier: Record<string, string> = {}
    propagation.inject(attempt.context, carrier)
    const { span } = attempt
    try {
      const response = await context.with(attempt.context, () => send(input, withHeaders(init, carrier)))
      if (span.isRecording()) {
        span.setAttribute('http.response.status_code', response.status)
        if (response.status >= 400) {
          span.setStatus({ code: SpanStatusCode.ERROR })
          span.setAttribute('error.type', String(response.status))
        }
      }
      return response
    } catch (error) {
      if (span.isRecording()) {
        span.recordException(error as Error)
        span.setStatus({ code: SpanStatusCode.ERROR, message: (error as Error)?.message })
        span.setAttribute('error.type', errorType(error))
      }
      throw error
    } finally {
      endAttempt(byKey.get(key as string))
    }
  }

  const client = create({ ...options, fetch: tracedFetch })

  function endAttempt(state: IntentState | undefined): void {
    if (!state?.attempt) return
    state.attempt.span.end()
    state.attempt = undefined
  }

  function open(id: string, key: string, span: Span, ctx: Context, owned: boolean, startedAt?: number) {
    const state: IntentState = { id, key, span, context: ctx, owned, startedAt, attempt: undefined }
    byId.set(id, state)
    byKey.set(key, state)
    if (recordKey && span.isRecording()) {
      span.setAttribute('oncely.key', key)
      span.setAttribute('oncely.intent.id', id)
    }
    return state
  }

  function close(state: IntentState): void {
    endAttempt(state)
    if (byId.get(state.id) === state) byId.delete(state.id)
    if (byKey.get(state.key) === state) byKey.delete(state.key)
    state.span.end()
  }

  function intentSpan(method: string, parent: Context, resumed: boolean): Span {
    return tracer.startSpan(
      `oncely.intent ${method}`,
      {
        kind: SpanKind.INTERNAL,
        attributes: { 'http.request.method': method, ...(resumed ? { 'oncely.resumed': true } : {}) },
      },
      parent,
    )
  }

  /** The intent's terminal event: outcome attributes, and the end of a span no call owns. */
  function finish(id: string, outcome: string, apply?: (span: Span) => void): void {
    meter.intents.add(1, { 'oncely.outcome': outcome })
    const state = byId.get(id)
    if (!state) return
    endAttempt(state)
    if (state.span.isRecording()) {
      state.span.setAttribute('oncely.outcome', outcome)
      apply?.(state.span)
    }
    if (!state.owned) close(state)
  }

  client.on('attempt', ({ id, key, attempt, method, url }) => {
    // An intent driven without a request() call of ours (resume(), or a join from another tab's claim).
    let state = byId.get(id)
    if (!state) {
      const parent = context.active()
      const span = intentSpan(method, parent, true)
      state = open(id, key, span, trace.setSpan(parent, span), false)
    }
    endAttempt(state)
    const attributes: Attributes = { 'http.request.method': method }
    meter.attempts.add(1, attributes)
    if (state.startedAt !== undefined) {
      meter.writeAhead.record((now() - state.startedAt) / 1_000, attributes)
      state.startedAt = undefined
    }
    const span = tracer.startSpan(
      method,
      {
        kind: SpanKind.CLIENT,
        attributes: { 'http.request.method': method, 'url.full': url, 'oncely.attempt': attempt },
      },
      state.context,
    )
    state.attempt = { span, context: trace.setSpan(state.context, span) }
  })
  client.on('retry', ({ id, reason, delayMs, retryAfter }) => {
    meter.retries.add(1, { 'oncely.retry.reason': reason })
    meter.retryDelay.record(delayMs / 1_000, { 'oncely.retry_after': retryAfter })
    const state = byId.get(id)
    endAttempt(state)
    if (state?.span.isRecording()) {
      state.span.addEvent('oncely.retry', {
        'oncely.retry.reason': reason,
        'oncely.retry.delay_ms': delayMs,
        'oncely.retry_after': retryAfter,
      })
    }
  })
  client.on('settled', ({ id, status, replayed, source, attempts }) =>
    finish(id, 'settled', (span) => {
      span.setAttribute('http.response.status_code', status)
      span.setAttribute('oncely.replayed', replayed)
      span.setAttribute('oncely.source', source)
      span.setAttribute('oncely.attempts', attempts)
    }),
  )
  client.on('failed', ({ id, error, pending }) =>
    finish(id, pending ? 'pending' : 'failed', (span) => {
      failed.add(span)
      span.recordException(error)
      span.setStatus({ code: SpanStatusCode.ERROR, message: error.message })
      span.setAttribute('error.type', error.name)
    }),
  )
  client.on('expired', ({ id }) =>
    finish(id, 'expired', (span) =>
      span.setStatus({ code: SpanStatusCode.ERROR, message: 'intent expired' }),
    ),
  )
  client.on('resumed', ({ outcome }) => meter.resumes.add(1, { 'oncely.outcome': outcome }))

  const observePending = async (result: ObservableResult) => {
    const pending = await client.pending()
    result.observe(pending.filter((p) => p.state === 'pending').length, { 'oncely.intent.state': 'pending' })
    result.observe(pending.filter((p) => p.state === 'expired').length, { 'oncely.intent.state': 'expired' })
  }
  meter.pending.addCallback(observePending)

  function request<T>(req: RequestOptions): Promise<OncelyResponse<T>> {
    const startedAt = now()
    const parent = context.active()
    const method = (req?.method ?? 'POST').toUpperCase()
    const span = intentSpan(method, parent, false)
    const ctx = trace.setSpan(parent, span)
    let state: IntentState | undefined
    const onIntent = (intent: { id: string; key: string }) => {
      // A second call for a named intent in flight joins the first: its span stays empty and says so.
      if (byId.has(intent.id)) span.setAttribute('oncely.intent.joined', true)
      else state = open(intent.id, intent.key, span, ctx, true, startedAt)
      req.onIntent?.(intent)
    }
    const settle = () => {
      if (state) close(state)
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
          if (span.isRecording() && !failed.has(span)) {
            span.recordException(error as Error)
            span.setStatus({ code: SpanStatusCode.ERROR, message: (error as Error)?.message })
            span.setAttribute('error.type', errorType(error))
          }
          settle()
          throw error
        },
      )
  }

  return {
    ...client,
    request: request as OncelyClient['request'],
    mutation: (definition) => (json, extra) =>
      request({
        ...definition,
        ...extra,
        json,
        headers: { ...definition.headers, ...extra?.headers },
      }) as never,
    async close() {
      meter.pending.removeCallback(observePending)
      for (const state of [...byId.values()]) close(state)
      await client.close()
    },
  }
}
