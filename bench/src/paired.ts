// Paired rounds: every round measures each scenario right after its baseline, so a ratio of two scenarios (oncely
// over the SQL floor, oncely over a peer) is taken round by round from measurements made seconds apart, and the
// target is judged on the median of those per-round ratios, with their spread, never on one round.
import type { ScenarioSummary } from './suites/compare.js'

export interface Spread {
  median: number
  min: number
  max: number
  /** Quartiles by linear interpolation (equal to min and max with three rounds or fewer). */
  q1: number
  q3: number
  /** The per-round values, in round order. */
  values: number[]
}

function quantile(sorted: readonly number[], q: number): number {
  const at = (sorted.length - 1) * q
  const lo = Math.floor(at)
  const hi = Math.ceil(at)
  return sorted[lo]! + (sorted[hi]! - sorted[lo]!) * (at - lo)
}

/** The median and spread of per-round values; undefined for none. */
export function spreadOf(values: readonly number[]): Spread | undefined {
  if (values.length === 0) return undefined
  const sorted = [...values].sort((a, b) => a - b)
  return {
    median: quantile(sorted, 0.5),
    min: sorted[0]!,
    max: sorted.at(-1)!,
    q1: quantile(sorted, 0.25),
    q3: quantile(sorted, 0.75),
    values: [...values],
  }
}

/** Round by round: the scenario's req/s over that of its baseline measured just before it. */
export const roundRatios = (summary: ScenarioSummary): number[] =>
  summary.pairs.map((pair) => pair.scenario.rps / pair.baseline.rps)

/**
 * Round by round, `a`'s ratio to its baseline over `b`'s: the baseline's drift between the two pairs cancels. Only
 * rounds both measured count.
 */
export function pairedRatios(a: ScenarioSummary, b: ScenarioSummary): number[] {
  const rounds = Math.min(a.pairs.length, b.pairs.length)
  const ra = roundRatios(a)
  const rb = roundRatios(b)
  return Array.from({ length: rounds }, (_, r) => ra[r]! / rb[r]!)
}

/** `0.91x (0.86–0.95, 3 rounds)`: a median with its min–max, over rounds (or `unit`, such as pairs of runs). */
export const describeSpread = (s: Spread, digits = 2, unit = 'rounds') =>
  `${s.median.toFixed(digits)}x (${s.min.toFixed(digits)}–${s.max.toFixed(digits)}, ${s.values.length} ${unit})`
