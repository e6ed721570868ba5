/** The page's "Flaky network" switch, read by {@link flakyFetch} at every attempt. */
export interface FlakySwitch {
  on: boolean
}

/**
 * A `fetch` that loses responses while `flaky.on`: it waits for the real response, so the server has done (and
 * committed) the work, then throws the same error a dropped connection gives. That is the failure idempotency keys
 * exist for: the client cannot tell whether the payment happened, so it must retry with the same key.
 */
export function flakyFetch(flaky: FlakySwitch): typeof fetch {
  return async (input, init) => {
    const response = await fetch(input, init)
    if (!flaky.on) return response
    await response.body?.cancel().catch(() => {})
    throw new TypeError('Failed to fetch')
  }
}
