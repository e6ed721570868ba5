// `@oncely/server/otel`: OpenTelemetry traces and metrics for the engine, its adapters, the outbox and the inbox.
// Depends on `@opentelemetry/api` only (an optional peer dependency); the main entry never loads this module.
export type { OutcomeName } from './engine.js'
export {
  ATTR_ATTEMPT,
  ATTR_INBOX_RESULT,
  ATTR_KEY,
  ATTR_OPERATION,
  ATTR_OUTCOME,
  ATTR_PROTOCOL,
  ATTR_REPLAYED,
  ATTR_SCOPE,
  instrumentEngine,
  outcomeName,
} from './engine.js'
export { ATTR_OUTBOX_RESULT, instrumentDispatcher } from './outbox.js'
export { traceHeaders } from './propagation.js'
export type { ServerTelemetryOptions } from './telemetry.js'
export { INSTRUMENTATION_NAME } from './telemetry.js'
export { VERSION } from './version.js'
