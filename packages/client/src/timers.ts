/** The clock and timers the client uses; injectable so tests can drive time. */
export interface Timers {
  /** Current time in ms since the epoch. */
  now(): number
  setTimeout(fn: () => void, ms: number): unknown
  clearTimeout(handle: unknown): void
}

// Each call reads the global at call time, so fake timers installed after import still apply.
export const defaultTimers: Timers = {
  now: () => Date.now(),
  setTimeout: (fn, ms) => globalThis.setTimeout(fn, ms),
  clearTimeout: (handle) => globalThis.clearTimeout(handle as ReturnType<typeof setTimeout>),
}

/** Waits `ms`, or rejects with the signal's reason as soon as it aborts. */
export function sleep(timers: Timers, ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason)
    const onAbort = () => {
      timers.clearTimeout(handle)
      reject(signal!.reason)
    }
    const handle = timers.setTimeout(() => {
      signal?.removeEventListener('abort', onAbort)
      resolve()
    }, ms)
    signal?.addEventListener('abort', onAbort, { once: true })
  })
}
