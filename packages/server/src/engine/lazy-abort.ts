/**
 * An AbortController created only if the handler reads `signal` (most never do, and creating one per request is
 * measurable on the hot path). Aborting before the signal was read records the reason for when it is.
 */
export class LazyAbort {
  #controller: AbortController | undefined
  #aborted = false
  #reason: unknown

  get signal(): AbortSignal {
    if (!this.#controller) {
      this.#controller = new AbortController()
      if (this.#aborted) this.#controller.abort(this.#reason)
    }
    return this.#controller.signal
  }

  abort(reason: unknown): void {
    if (this.#aborted) return
    this.#aborted = true
    this.#reason = reason
    this.#controller?.abort(reason)
  }
}
