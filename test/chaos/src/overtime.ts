/**
 * The fault phase's overtime. A run's fault phase lasts its duration, but on a loaded machine the long faults (a
 * failover, a pool-saturating burst, restarts that take seconds) can use it up before the nemesis's first pass has
 * reached every kind, or before a restarted instance served the request its crash point fires on; the run would
 * then fail with kinds that "never happened", which says nothing about oncely. So the phase goes on, faults and all,
 * until every requested kind happened at least once, for at most `maxMs` more; what is still missing then fails the
 * run as before.
 */
import { PROBE_FAULTS } from './dispatch.js'
import type { FaultKind } from './faults.js'
import type { HistoryEvent } from './history.js'

/** The kinds the generator's probes are counted as: sent after their originals settle, so late by design. */
export const PROBE_KINDS: ReadonlySet<string> = new Set(Object.values(PROBE_FAULTS))

/** Injected faults per kind, from the history: each `start` or `once` event counts one. */
export function injectedFaults(history: readonly HistoryEvent[]): Record<string, number> {
  const faults: Record<string, number> = {}
  for (const event of history) {
    if (event.type === 'fault' && event.phase !== 'stop') faults[event.fault] = (faults[event.fault] ?? 0) + 1
  }
  return faults
}

export interface OvertimeOptions {
  /** The kinds that must have happened. */
  faults: readonly FaultKind[]
  /** Faults injected so far, per kind. */
  happened: () => Record<string, number>
  /** The most the phase may go on. */
  maxMs: number
  log: (line: string) => void
  /** How often to look again. @default 500 */
  pollMs?: number
}

/** Resolves once every kind in `faults` happened, or `maxMs` later; how long it waited. */
export async function overtime(options: OvertimeOptions): Promise<number> {
  const started = Date.now()
  const missing = () => options.faults.filter((kind) => !(options.happened()[kind] ?? 0))
  if (missing().length === 0) return 0
  options.log(
    `fault phase goes on (at most ${Math.round(options.maxMs / 1000)} s) until ${missing().join(', ')} happened`,
  )
  while (missing().length > 0 && Date.now() - started < options.maxMs) {
    await new Promise((resolve) => setTimeout(resolve, options.pollMs ?? 500))
  }
  const waited = Date.now() - started
  options.log(
    `fault phase went on ${(waited / 1000).toFixed(1)} s${missing().length ? `; still missing: ${missing().join(', ')}` : ''}`,
  )
  return waited
}
