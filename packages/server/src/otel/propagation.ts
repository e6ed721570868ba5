import { context, propagation } from '@opentelemetry/api'

/**
 * The active trace context as message headers (W3C `traceparent` and `tracestate` with the default propagator), to
 * pass as `enqueue()`'s `headers` so the consumer continues the trace: the instrumented dispatcher publishes the
 * message in a child span of it, and the inbox's execution in a child of that. Empty when no span is active or no
 * propagator is registered.
 *
 * @example
 * import { traceHeaders } from '@oncely/server/otel'
 * await enqueue(ctx.tx, { topic: 'orders.created', payload: order, headers: traceHeaders() })
 */
export function traceHeaders(): Record<string, string> {
  const carrier: Record<string, string> = {}
  propagation.inject(context.active(), carrier)
  return carrier
}
