// Internal seams for `@oncely/server/otel`. Nothing here imports OpenTelemetry, so the main entries never load it.
// The keys are `Symbol.for(...)`: every bundle of this package (one per entry, ESM and CJS) must agree on them.
import type { EngineEvent } from './engine/types.js'

/** What an engine tells an attached observer: each of its events, and each reap run (not an `onEvent` event). */
export type EngineSignal =
  | EngineEvent
  | { type: 'reaped'; deleted: number; durationMs: number; error?: unknown }

/**
 * An engine's observer slot: `engine[ENGINE_SIGNALS](observer)` attaches an observer and returns the detach
 * function. Set on every engine `createEngine` returns, not enumerable (no part of the engine a user sees), so a
 * wrapper keeps it only through {@link wrapEngine}: telemetry on a wrapper spread by hand sees its executions but not
 * the engine's own signals (takeovers, store errors, reaper runs).
 */
export const ENGINE_SIGNALS: unique symbol = Symbol.for('oncely.server.engine-signals')

export interface Observable {
  [ENGINE_SIGNALS]?: (observer: (signal: EngineSignal) => void) => () => void
}

/** `engine` with `overrides` (its `execute`, say), keeping the observer slot: how oncely's own wrappers are built. */
export function wrapEngine<E extends object>(engine: E, overrides: Partial<E>): E {
  const wrapped = { ...engine, ...overrides }
  const signals = (engine as Observable)[ENGINE_SIGNALS]
  if (signals) Object.defineProperty(wrapped, ENGINE_SIGNALS, { value: signals, enumerable: false })
  return wrapped
}

/**
 * The datasource an execution's transaction came from, on the `ExecutionContext` the engine hands a handler: how
 * `steps()` recognises being given that same pool for its own transactions (which would deadlock under load).
 */
export const STORE_DATABASE: unique symbol = Symbol.for('oncely.server.store-database')

/** An inbox delivery, attached by `createInbox` to the input it hands the engine (the engine ignores it). */
export const INBOX_DELIVERY: unique symbol = Symbol.for('oncely.server.inbox-delivery')

export interface InboxDelivery {
  consumer: string
  topic: string
  messageId: string
  /** The message's headers, for its trace context (`traceparent`, `tracestate`). */
  headers: Readonly<Record<string, string>> | undefined
}

export interface MarkedInput {
  [INBOX_DELIVERY]?: InboxDelivery
}

/** The W3C trace-context headers, the only ones the message adapters carry into `ConsumeInput.headers`. */
export const TRACE_HEADERS = ['traceparent', 'tracestate'] as const

/** The trace-context headers found by `get` (lower-case names), or `undefined` when there are none. */
export function traceHeadersFrom(
  get: (name: string) => string | undefined,
): Record<string, string> | undefined {
  let found: Record<string, string> | undefined
  for (const name of TRACE_HEADERS) {
    const value = get(name)
    if (typeof value !== 'string' || value === '') continue
    found ??= {}
    found[name] = value
  }
  return found
}
