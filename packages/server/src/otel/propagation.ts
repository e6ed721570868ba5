import { context, propagation } from '@opentelemetry/api'
import { setOutboxTraceInjector } from '../hooks.js'

/** The active context's propagation headers (W3C `traceparent`, `tracestate` with the default propagator). */
function activeTraceHeaders(): Record<string, string> | undefined {
  const carrier: Record<string, string> = {}
  propagation.inject(context.active(), carrier)
  return Object.keys(carrier).length > 0 ? carrier : undefined
}

/**
 * Makes `enqueue` add the active trace context to each message's headers. Process-wide and idempotent: the
 * propagator and the active context are process-wide too.
 */
export function installOutboxPropagation(): void {
  setOutboxTraceInjector(activeTraceHeaders)
}
