import { IDEMPOTENCY_KEY_HEADER } from '@oncely/protocol'
import {
  type Attributes,
  type Context,
  context,
  propagation,
  type Span,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  trace,
} from '@opentelemetry/api'
import type { OncelyClient } from '../client.js'
import type { ClientEvents } from '../events.js'
import type { Instruments } from './instruments.js'

/** A monotonic clock in ms where there is one. */
export const now = (): number => globalThis.performance?.now() ?? Date.now()

/** One intent being driven: its span, and the attempt in flight. */
export interface IntentState {
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

/**
 * The spans of the intents one client drives: a span per intent with a client span per attempt, found by intent
 * id (from the client's events) and by idempotency key (from the headers of each `fetch` call), and the metrics
 * its events record.
 */
export class IntentSpans {
  readonly byId = new Map<string, IntentState>()
  readonly byKey = new Map<string, IntentState>()
  /** Intent spans whose run failed: recorded by the `failed` event already. */
  readonly failed = new WeakSet<Span>()

  constructor(
    readonly tracer: Tracer,
    readonly meter: Instruments,
    readonly recordKey: boolean,
  ) {}

  /** `send` with the attempt span of the intent whose key a call carries around it, and its `traceparent`. */
  tracedFetch(send: typeof fetch): typeof fetch {
    return async (input, init) => {
      const key = headerOf(init, IDEMPOTENCY_KEY_HEADER)
      const attempt = key === undefined ? undefined : this.byKey.get(key)?.attempt
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
        recordError(span, error)
        throw error
      } finally {
        this.endAttempt(this.byKey.get(key as string))
      }
    }
  }

  /** Listens to `client`'s events: attempts, retries, and the end of each run. */
  listen(client: OncelyClient): void {
    client.on('attempt', (event) => this.#attempt(event))
    client.on('retry', (event) => this.#retry(event))
    client.on('settled', ({ id, status, replayed, source, attempts }) =>
      this.finish(id, 'settled', (span) => {
        span.setAttribute('http.response.status_code', status)
        span.setAttribute('oncely.replayed', replayed)
        span.setAttribute('oncely.source', source)
        span.setAttribute('oncely.attempts', attempts)
      }),
    )
    client.on('failed', ({ id, error, pending }) =>
      this.finish(id, pending ? 'pending' : 'failed', (span) => {
        this.failed.add(span)
        span.recordException(error)
        span.setStatus({ code: SpanStatusCode.ERROR, message: error.message })
        span.setAttribute('error.type', error.name)
      }),
    )
    client.on('expired', ({ id }) =>
      this.finish(id, 'expired', (span) =>
        span.setStatus({ code: SpanStatusCode.ERROR, message: 'intent expired' }),
      ),
    )
    client.on('resumed', ({ outcome }) => this.meter.resumes.add(1, { 'oncely.outcome': outcome }))
  }

  /** Starts following intent `id` under `span` (in `ctx`). */
  open(id: string, key: string, span: Span, ctx: Context, owned: boolean, startedAt?: number): IntentState {
    const state: IntentState = { id, key, span, context: ctx, owned, startedAt, attempt: undefined }
    this.byId.set(id, state)
    this.byKey.set(key, state)
    if (this.recordKey && span.isRecording()) {
      span.setAttribute('oncely.key', key)
      span.setAttribute('oncely.intent.id', id)
    }
    return state
  }

  /** Stops following an intent and ends its span. */
  close(state: IntentState): void {
    this.endAttempt(state)
    if (this.byId.get(state.id) === state) this.byId.delete(state.id)
    if (this.byKey.get(state.key) === state) this.byKey.delete(state.key)
    state.span.end()
  }

  endAttempt(state: IntentState | undefined): void {
    if (!state?.attempt) return
    state.attempt.span.end()
    state.attempt = undefined
  }

  /** A new span for an intent of `method`, a child of `parent`. */
  intentSpan(method: string, parent: Context, resumed: boolean): Span {
    return this.tracer.startSpan(
      `oncely.intent ${method}`,
      {
        kind: SpanKind.INTERNAL,
        attributes: { 'http.request.method': method, ...(resumed ? { 'oncely.resumed': true } : {}) },
      },
      parent,
    )
  }

  /** The intent's terminal event: outcome attributes, and the end of a span no call owns. */
  finish(id: string, outcome: string, apply?: (span: Span) => void): void {
    this.meter.intents.add(1, { 'oncely.outcome': outcome })
    const state = this.byId.get(id)
    if (!state) return
    this.endAttempt(state)
    if (state.span.isRecording()) {
      state.span.setAttribute('oncely.outcome', outcome)
      apply?.(state.span)
    }
    if (!state.owned) this.close(state)
  }

  #attempt({ id, key, attempt, method, url }: ClientEvents['attempt']): void {
    // An intent driven without a request() call of ours (resume(), or a join from another tab's claim).
    let state = this.byId.get(id)
    if (!state) {
      const parent = context.active()
      const span = this.intentSpan(method, parent, true)
      state = this.open(id, key, span, trace.setSpan(parent, span), false)
    }
    this.endAttempt(state)
    const attributes: Attributes = { 'http.request.method': method }
    this.meter.attempts.add(1, attributes)
    if (state.startedAt !== undefined) {
      this.meter.writeAhead.record((now() - state.startedAt) / 1_000, attributes)
      state.startedAt = undefined
    }
    const span = this.tracer.startSpan(
      method,
      {
        kind: SpanKind.CLIENT,
        attributes: { 'http.request.method': method, 'url.full': url, 'oncely.attempt': attempt },
      },
      state.context,
    )
    state.attempt = { span, context: trace.setSpan(state.context, span) }
  }

  #retry({ id, reason, delayMs, retryAfter }: ClientEvents['retry']): void {
    this.meter.retries.add(1, { 'oncely.retry.reason': reason })
    this.meter.retryDelay.record(delayMs / 1_000, { 'oncely.retry_after': retryAfter })
    const state = this.byId.get(id)
    this.endAttempt(state)
    if (state?.span.isRecording()) {
      state.span.addEvent('oncely.retry', {
        'oncely.retry.reason': reason,
        'oncely.retry.delay_ms': delayMs,
        'oncely.retry_after': retryAfter,
      })
    }
  }
}

/** Records `error` on a recording `span`: the exception, an error status and its `error.type`. */
export function recordError(span: Span, error: unknown): void {
  if (!span.isRecording()) return
  span.recordException(error as Error)
  span.setStatus({ code: SpanStatusCode.ERROR, message: (error as Error)?.message })
  span.setAttribute('error.type', error instanceof Error ? error.name : '_OTHER')
}

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
