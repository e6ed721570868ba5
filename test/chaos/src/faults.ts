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

/**
 * Faults of a Citus cluster's workers, injected only with `--database citus`: a worker restarted (a clean or an
 * immediate shutdown, as a node's restart or crash), and every connection to the run's database on one worker
 * terminated. A tenant whose shard the worker holds is unavailable meanwhile; the others are served.
 */
export const WORKER_FAULTS = ['restart-worker', 'kill-worker-connections'] as const

/**
 * Faults of the pooler, injected only with `--pooler pgbouncer`: PgBouncer restarted on its port, cleanly (its safe
 * shutdown, after the transactions in progress) or as a crash (every client and server connection dropped at once).
 */
export const POOLER_FAULTS = ['restart-pooler'] as const

/** Faults of the one Postgres server the driver owns, which a Citus cluster does not have. */
const SINGLE_SERVER_FAULTS: readonly string[] = ['restart-db', 'failover']

/** Every fault kind of a run on one Postgres, the default there. */
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
  'expired-changed-payload',
] as const

/** Every fault kind a run may name. */
export const ALL_FAULT_KINDS = [...FAULT_KINDS, ...WORKER_FAULTS, ...POOLER_FAULTS] as const

export type FaultKind = (typeof ALL_FAULT_KINDS)[number]

/** Where the demo's data lives: one Postgres (with a standby for failovers), or a Citus cluster. */
export type Database = 'postgres' | 'citus'

/** How the demo reaches its database: directly, or through PgBouncer in transaction mode. */
export type Pooler = 'none' | 'pgbouncer'

/** The fault kinds that can happen on `database` reached through `pooler`: every kind by default. */
export function faultKindsOf(database: Database, pooler: Pooler = 'none'): FaultKind[] {
  const kinds: FaultKind[] =
    database === 'postgres'
      ? [...FAULT_KINDS]
      : [...FAULT_KINDS.filter((kind) => !SINGLE_SERVER_FAULTS.includes(kind)), ...WORKER_FAULTS]
  if (pooler === 'none') return kinds
  // Next to the other brief database fault, ahead of the long ones (a failover, a pool-saturating burst): the
  // nemesis injects each kind once in this order first, and a quick run's fault phase must reach it.
  const at = kinds.indexOf('kill-db-connections') + 1
  return [...kinds.slice(0, at), ...POOLER_FAULTS, ...kinds.slice(at)]
}

export function isFaultKind(value: string): value is FaultKind {
  return (ALL_FAULT_KINDS as readonly string[]).includes(value)
}
