/**
 * What the layer scenarios share: service discovery, waiting, and the result shape.
 */
// optionalService and waitFor live in @oncely/test-support, shared with the server's layer tests.
export { optionalService, waitFor } from '@oncely/test-support'

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** Counts per fault kind; every kind a scenario injects starts at 0, so a kind that never happened shows. */
export type FaultCounts = Record<string, number>

/** What every scenario returns: its fault counts, its violations (empty when it passed) and its duration. */
export interface ScenarioResult {
  faults: FaultCounts
  violations: string[]
  durationMs: number
  /** Scenario-specific numbers for the report (messages, publish attempts, keys, ...). */
  stats: Record<string, number>
}
