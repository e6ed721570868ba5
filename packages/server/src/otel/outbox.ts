import { performance } from 'node:perf_hooks'
import {
  type Attributes,
  type Context,
  context,
  type ObservableResult,
  propagation,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  trace,
} from '@opentelemetry/api'
import type pg from 'pg'
import { hasMethods, objectOptions } from '../options/check.js'
import type { DispatcherEvent, DispatcherOptions } from '../outbox/dispatcher.js'
import { outboxNames } from '../outbox/names.js'
import type { OutboxMessage, Publisher } from '../outbox/types.js'
import { errorType, resolveTelemetry, type ServerTelemetryOptions } from './telemetry.js'

export const ATTR_OUTBOX_RESULT = 'oncely.outbox.result'

/** The message's trace context when it carries one, else the active context. */
function messageParent(message: OutboxMessage): Context {
  const extracted = propagation.extract(ROOT_CONTEXT, message.headers)
  const remote = trace.getSpanContext(extracted)
  return remote && trace.isSpanContextValid(remote) ? extracted : context.active()
}

/**
 * Instruments an outbox dispatcher: pass its options through this function. Each publish gets a producer span, a
 * child of the trace the message was enqueued in (the business transaction's, carried in its `traceparent`
 * header), and the message leaves with that span's trace context in its headers, so the consumer's inbox continues
 * the same trace. Counts publishes by result (published, retried, dead, lease_lost), times the publisher, and
 * reports the outbox lag (age of the oldest pending message, read from the table when metrics are collected).
 * Your own `onEvent` still receives every event.
 *
 * @example
 * import { instrumentDispatcher } from '@oncely/server/otel'
 * const dispatcher = createDispatcher(instrumentDispatcher({ pool, publisher: jetStreamPublisher({ js }) }))
 */
export function instrumentDispatcher(
  options: DispatcherOptions,
  telemetryOptions: ServerTelemetryOptions = {},
): DispatcherOptions {
  objectOptions('instrumentDispatcher()', options)
  const { publisher } = options
  hasMethods('publisher', publisher, ['publish'], 'a publisher, with a `publish(message)` method')
  const pool = hasMethods('pool', options.pool, ['query'], 'a pg.Pool')
  const { table } = outboxNames(options.schema)
  const { tracer, instruments } = resolveTelemetry(
    telemetryOptions,
    'instrumentDispatcher() (its second argument)',
  )

  const traced: Publisher = {
    async publish(message) {
      const parent = messageParent(message)
      const topic: Attributes = { 'messaging.destination.name': message.topic }
      const span = tracer.startSpan(
        `send ${message.topic}`,
        {
          kind: SpanKind.PRODUCER,
          attributes: {
            ...topic,
            'messaging.operation.type': 'send',
            'messaging.operation.name': 'send',
            'messaging.message.id': message.id,
            'oncely.outbox.attempt': message.attempt,
          },
        },
        parent,
      )
      const active = trace.setSpan(parent, span)
      const headers = { ...message.headers }
      propagation.inject(active, headers)
      const started = performance.now()
      let failure: unknown
      try {
        await context.with(active, () => publisher.publish({ ...message, headers }))
      } catch (error) {
        failure = error ?? new Error('publish failed')
        if (span.isRecording()) {
          span.recordException(error as Error)
          span.setStatus({ code: SpanStatusCode.ERROR, message: String((error as Error)?.message ?? error) })
          span.setAttribute('error.type', errorType(error))
        }
        throw error
      } finally {
        instruments.outboxPublishDuration.record(
          (performance.now() - started) / 1_000,
          failure === undefined ? topic : { ...topic, 'error.type': errorType(failure) },
        )
        span.end()
      }
    },
  }

  const result: Record<string, string | undefined> = {
    published: 'published',
    failed: 'retried',
    dead: 'dead',
    lease_lost: 'lease_lost',
  }
  const onEvent = (event: DispatcherEvent) => {
    try {
      const name = result[event.type]
      if (name !== undefined) {
        instruments.outboxMessages.add(1, {
          [ATTR_OUTBOX_RESULT]: name,
          ...('topic' in event ? { 'messaging.destination.name': event.topic } : {}),
        })
      }
    } catch {
      // Telemetry must not change what the dispatcher does.
    }
    options.onEvent?.(event)
  }

  observeLag(pool, table, instruments.outboxLag)
  return { ...options, publisher: traced, onEvent }
}

/**
 * Reports the age of the oldest pending message of `table` whenever metrics are collected (one indexed query per
 * collection); stops once the pool has ended.
 */
function observeLag(
  pool: pg.Pool,
  table: string,
  gauge: ReturnType<typeof resolveTelemetry>['instruments']['outboxLag'],
): void {
  const attributes = { 'oncely.outbox.table': table.replaceAll('"', '') }
  const callback = async (observation: ObservableResult) => {
    if ((pool as { ended?: boolean }).ended) {
      gauge.removeCallback(callback)
      return
    }
    try {
      const { rows } = await pool.query<{ lag: number | null }>(
        `SELECT extract(epoch FROM now() - created_at)::float8 AS lag FROM ${table} WHERE status = 'pending' ORDER BY seq LIMIT 1`,
      )
      observation.observe(Math.max(0, rows[0]?.lag ?? 0), attributes)
    } catch {
      // No observation this time (the database is down): the gauge shows a gap, not a made-up 0.
    }
  }
  gauge.addCallback(callback)
}
