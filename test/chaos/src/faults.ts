/** The fault kinds a run can inject, as named by `--faults` and counted in the report. docs/chaos.md describes each. */
import { CHAOS_POINTS } from '@oncely/payments-api/src/config.ts'

/** Network faults, injected by the proxies in front of the API instances. */
export const NETWORK_FAULTS = ['drop-request', 'drop-response', 'delay', 'duplicate', 'black-hole'] as const

/**
 * Server crash points: the demo SIGKILLs itself there when `ONCELY_CRASH_AT` names the step. The demo's own list, so
 * a point added there is injected and counted here without a second edit.
 */
export const SERVER_CRASH_POINTS = CHAOS_POINTS

/** Client worker crash points: the worker SIGKILLs itself there when told to. */
export const WORKER_CRASH_POINTS = ['after-intent-write', 'after-send', 'after-response'] as const

export const FAULT_KINDS = [
  ...NETWORK_FAULTS,
  ...SERVER_CRASH_POINTS.map((step) => `crash-${step}` as const),
  'pause-server',
  'stall-server',
  'kill-db-connections',
  'restart-db',
  'failover',
  'saturate-pool',
  ...WORKER_CRASH_POINTS.map((step) => `kill-worker-${step}` as const),
  'changed-payload',
  'reordered-payload',
  'expired-replay',
] as const

export type FaultKind = (typeof FAULT_KINDS)[number]

export function isFaultKind(value: string): value is FaultKind {
  return (FAULT_KINDS as readonly string[]).includes(value)
}
