import type { EngineSignal } from '../hooks.js'
import type { EngineEvent } from './types.js'

/**
 * Where an engine's events go: the `onEvent` option, and the observers attached through `ENGINE_SIGNALS`
 * (`@oncely/server/otel`). An observer must not change the outcome of an execution, so whatever one throws is
 * dropped.
 */
export class EngineEvents {
  readonly #onEvent: ((event: EngineEvent) => void) | undefined
  readonly #observers = new Set<(signal: EngineSignal) => void>()
  /**
   * Undefined while nobody listens (no onEvent, no observer), so that `events.emit?.({...})` does not even build
   * the event; changed only by {@link EngineEvents.observe}.
   */
  emit: ((event: EngineEvent) => void) | undefined

  constructor(onEvent: ((event: EngineEvent) => void) | undefined) {
    this.#onEvent = onEvent
    this.emit = onEvent ? this.#deliver : undefined
  }

  /** Whether events reach the application (`onEvent`), not only observers. */
  get toApplication(): boolean {
    return this.#onEvent !== undefined
  }

  /** Tells the observers only: a signal that is not an `onEvent` event (a reap run). */
  signal(signal: EngineSignal): void {
    for (const observe of this.#observers) {
      try {
        observe(signal)
      } catch {
        // An observer must not change the outcome of an execution.
      }
    }
  }

  /** Attaches an observer; returns the function that detaches it (true when it was attached). */
  observe(observer: (signal: EngineSignal) => void): () => boolean {
    this.#observers.add(observer)
    this.emit = this.#deliver
    return () => {
      const removed = this.#observers.delete(observer)
      if (!this.#onEvent && this.#observers.size === 0) this.emit = undefined
      return removed
    }
  }

  readonly #deliver = (event: EngineEvent): void => {
    try {
      this.#onEvent?.(event)
    } catch {
      // An observer must not change the outcome of an execution.
    }
    if (this.#observers.size > 0) this.signal(event)
  }
}
