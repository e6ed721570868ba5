/**
 * How long a probe (a raw same-key request) keeps trying for a definite answer. Time, not attempts: a refused
 * connection fails at once, so eight attempts could end in under 4 s while a crashed API instance restarts, leaving
 * the probe's key with no outcome and, after a crash mid-handler, its leased row in progress after the final drain.
 * Keys live 45 s by default, so 20 s fits well inside a key's life.
 */
export const PROBE_BUDGET_MS = 20_000
const MAX_DELAY_MS = 1_000

/** The pause before the next attempt, or undefined once the budget is spent. `attempt` counts from 1. */
export function nextProbeDelay(attempt: number, elapsedMs: number): number | undefined {
  const delay = Math.min(100 * attempt, MAX_DELAY_MS)
  return elapsedMs + delay > PROBE_BUDGET_MS ? undefined : delay
}
