const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/**
 * The bounded wait of a duplicate for the attempt that holds its key (`ExecuteInput.wait`): each call sleeps and
 * resolves `true` while the wait has time left, polling at 25 ms and doubling to 500 ms, and resolves `false` at
 * once when the next poll would end past the deadline (or when there is no wait at all). The wait counts from
 * `startedAt`, the request's start.
 */
export function boundedWait(timeoutMs: number | undefined, startedAt = Date.now()): () => Promise<boolean> {
  const deadline = timeoutMs === undefined ? 0 : startedAt + timeoutMs
  let pollMs = 25
  return async () => {
    if (Date.now() + pollMs >= deadline) return false
    await sleep(pollMs)
    pollMs = Math.min(pollMs * 2, 500)
    return true
  }
}
