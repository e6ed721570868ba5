/** A minimal typed event emitter; a listener that throws never breaks the client. */
export class Emitter<Events extends object> {
  readonly #listeners = new Map<keyof Events, Set<(payload: never) => void>>()

  on<E extends keyof Events>(event: E, listener: (payload: Events[E]) => void): () => void {
    const set = this.#listeners.get(event) ?? new Set()
    this.#listeners.set(event, set)
    set.add(listener as (payload: never) => void)
    return () => set.delete(listener as (payload: never) => void)
  }

  emit<E extends keyof Events>(event: E, payload: Events[E]): void {
    for (const listener of this.#listeners.get(event) ?? []) {
      try {
        ;(listener as (payload: Events[E]) => void)(payload)
      } catch (error) {
        // Report it without unwinding the retry loop.
        if (typeof globalThis.reportError === 'function') globalThis.reportError(error)
        else console.error(error)
      }
    }
  }
}
