/** The driver's options: parsed from the command line, validated, and turned back into a reproduce command. */
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import {
  ALL_FAULT_KINDS,
  type Database,
  type FaultKind,
  faultKindsOf,
  isFaultKind,
  type Pooler,
} from './faults.js'
import { MAX_SEED, randomSeed } from './random.js'

export type Tier = 'quick' | 'long'

export interface ChaosOptions {
  /** Everything random in the run derives from it. @default a fresh random seed, printed */
  seed: number
  /** Sizing preset. @default 'quick' */
  tier: Tier
  /** How many intents the generator issues (probes included). @default 200 (quick), 5000 (long) */
  intents: number
  /** Upper bound on the fault phase; the final drain comes after. @default 60 s (quick), 30 min (long) */
  durationMs: number
  /** Fault kinds to inject. @default all of them */
  faults: FaultKind[]
  /** Where to write the JSON report. @default `<runDir>/report.json` */
  report: string
  /** `false` runs the demo without its idempotency layer: the checker must then report violations. @default true */
  idempotency: boolean
  /** `false` runs the demo without fencing its completions: a paused server's late write must be caught. @default true */
  fencing: boolean
  /**
   * `false` runs the demo without its ledger's natural key (one payment per tenant and charge): a retry after its key
   * expired must then be caught booking a second payment. @default true
   */
  backstop: boolean
  /**
   * How long the demo replays a finished key (`ONCELY_RETENTION_MS`). Short, so keys expire during the run: late
   * retries and `expired-replay` probes reach the server as new requests. @default 45 s
   */
  retentionMs: number
  /** The engine's reservation protocol in the demo (`ONCELY_RESERVATION`). @default 'lock' */
  reservation: 'row' | 'lock'
  /**
   * How the primary's commits reach its standby, for the `failover` fault: `sync` (the primary commits what the
   * standby has flushed: nothing acknowledged may be lost) or `async` (what the standby had not received is lost,
   * and the checker reports it as its own class). @default 'sync'
   */
  replication: 'sync' | 'async'
  /**
   * What the demo reaches Postgres through: `pgbouncer`, a real PgBouncer in transaction mode (the demo then runs with
   * `DATABASE_POOLER=transaction`), or `none`. @default 'none'
   */
  pooler: Pooler
  /**
   * Where the demo's data lives: one Postgres, or a Citus cluster (a coordinator and two workers started for the
   * run, the demo's tables distributed by tenant), whose faults are its workers' (`restart-worker`,
   * `kill-worker-connections`) instead of a single server's restart and failover.
   */
  database: Database
  /**
   * The demo's in-process replay cache (`ONCELY_REPLAY_CACHE`). The engine empties it when its connections break, so
   * a failover that loses a finished record is not answered from memory. @default true
   */
  replayCache: boolean
  /** API instances behind the proxies. @default 2 */
  servers: number
  /** Client worker processes. @default 3 */
  workers: number
  /** Directory for the history, logs, report and database dump. @default test/chaos/runs/<time>-seed-<seed> */
  runDir: string
}

/** Keys expire within a quick run, and a probe budget (about 20 s) fits well inside a key's life. */
const DEFAULT_RETENTION_MS = 45_000

const TIERS: Record<Tier, { intents: number; durationMs: number }> = {
  quick: { intents: 200, durationMs: 60_000 },
  long: { intents: 5000, durationMs: 30 * 60_000 },
}

export const USAGE = `Usage: pnpm chaos [options]
  --seed <n>            unsigned 32-bit seed (default: random, printed)
  --tier quick|long     sizing preset (default: quick)
  --intents <n>         number of intents (default: 200 quick, 5000 long)
  --duration <time>     fault phase bound, e.g. 90s, 10m (default: 60s quick, 30m long)
  --faults a,b,c        fault kinds (default: every kind the database can have): ${ALL_FAULT_KINDS.join(', ')}
  --report <file>       JSON report path (default: <run dir>/report.json)
  --idempotency off     run the demo without idempotency (the checker must fail)
  --fencing off         run the demo without fencing (the checker must fail)
  --backstop off        run the demo without its ledger's natural key (the checker must fail)
  --retention <time>    how long the demo replays a finished key (default: 45s)
  --reservation lock|row  the engine's reservation protocol (default: lock)
  --replication sync|async  the standby's replication, for the failover fault (default: sync)
  --pooler none|pgbouncer  reach Postgres through PgBouncer in transaction mode (default: none)
  --database postgres|citus  one Postgres, or a Citus cluster of a coordinator and two workers (default: postgres)
  --replay-cache off    run the demo without its engine's in-process replay cache
  --servers <n>         API instances (default: 2)
  --workers <n>         client workers (default: 3)
  --run-dir <dir>       where to keep history, logs, report and dump`

/**
 * Parses `argv` (without node and the script). Throws a TypeError naming the bad option.
 *
 * @param root Directory that default run directories are created under.
 */
export function parseOptions(argv: string[], root: string, now = new Date()): ChaosOptions {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      seed: { type: 'string' },
      tier: { type: 'string' },
      intents: { type: 'string' },
      duration: { type: 'string' },
      faults: { type: 'string' },
      report: { type: 'string' },
      idempotency: { type: 'string' },
      fencing: { type: 'string' },
      backstop: { type: 'string' },
      retention: { type: 'string' },
      reservation: { type: 'string' },
      replication: { type: 'string' },
      pooler: { type: 'string' },
      database: { type: 'string' },
      'replay-cache': { type: 'string' },
      servers: { type: 'string' },
      workers: { type: 'string' },
      'run-dir': { type: 'string' },
    },
  })
  const tier = values.tier ?? 'quick'
  if (tier !== 'quick' && tier !== 'long') throw new TypeError('Expected `--tier` to be quick or long.')
  const seed = values.seed === undefined ? randomSeed() : integer('--seed', values.seed, 0, MAX_SEED)
  const database = oneOf('--database', values.database, ['postgres', 'citus'])
  const pooler = oneOf('--pooler', values.pooler, ['none', 'pgbouncer'])
  const possible = faultKindsOf(database, pooler)
  const faults = values.faults === undefined ? possible : parseFaults(values.faults)
  const impossible = faults.filter((kind) => !possible.includes(kind))
  if (impossible.length > 0) {
    throw new TypeError(
      `\`--faults\` names ${impossible.join(', ')}, which cannot happen with \`--database ${database}\` and \`--pooler ${pooler}\`; it can have ${possible.join(', ')}.`,
    )
  }
  const stamp = now.toISOString().replace(/[:.]/g, '-')
  const runDir = values['run-dir'] ?? join(root, 'runs', `${stamp}-seed-${seed}`)
  return {
    seed,
    tier,
    intents:
      values.intents === undefined ? TIERS[tier].intents : integer('--intents', values.intents, 1, 1e6),
    durationMs: values.duration === undefined ? TIERS[tier].durationMs : parseDuration(values.duration),
    faults,
    report: values.report ?? join(runDir, 'report.json'),
    idempotency: onOff('--idempotency', values.idempotency),
    fencing: onOff('--fencing', values.fencing),
    backstop: onOff('--backstop', values.backstop),
    retentionMs: values.retention === undefined ? DEFAULT_RETENTION_MS : parseRetention(values.retention),
    reservation: parseReservation(values.reservation),
    replication: oneOf('--replication', values.replication, ['sync', 'async']),
    pooler,
    database,
    replayCache: onOff('--replay-cache', values['replay-cache']),
    servers: values.servers === undefined ? 2 : integer('--servers', values.servers, 2, 8),
    workers: values.workers === undefined ? 3 : integer('--workers', values.workers, 1, 32),
    runDir,
  }
}

/**
 * The one command line that reruns this configuration with the same seed, from the repository root (where
 * `pnpm chaos` starts an embedded Postgres when `DATABASE_URL` is unset) or from test/chaos.
 */
export function reproduceCommand(options: ChaosOptions): string {
  const args = [
    'pnpm chaos',
    `--seed ${options.seed}`,
    `--tier ${options.tier}`,
    `--intents ${options.intents}`,
    `--duration ${Math.round(options.durationMs / 1000)}s`,
    `--servers ${options.servers}`,
    `--workers ${options.workers}`,
  ]
  if (options.faults.length !== faultKindsOf(options.database, options.pooler).length)
    args.push(`--faults ${options.faults.join(',') || 'none'}`)
  if (!options.idempotency) args.push('--idempotency off')
  if (!options.fencing) args.push('--fencing off')
  if (!options.backstop) args.push('--backstop off')
  if (options.retentionMs !== DEFAULT_RETENTION_MS)
    args.push(`--retention ${Math.round(options.retentionMs / 1000)}s`)
  if (options.reservation !== 'lock') args.push(`--reservation ${options.reservation}`)
  if (options.replication !== 'sync') args.push(`--replication ${options.replication}`)
  if (options.pooler !== 'none') args.push(`--pooler ${options.pooler}`)
  if (options.database !== 'postgres') args.push(`--database ${options.database}`)
  if (!options.replayCache) args.push('--replay-cache off')
  return args.join(' ')
}

function integer(name: string, text: string, min: number, max: number): number {
  const value = Number(text)
  if (!/^\d+$/.test(text) || value < min || value > max) {
    throw new TypeError(`Expected \`${name}\` to be an integer in [${min}, ${max}], got ${text}.`)
  }
  return value
}

function parseDuration(text: string, name = '--duration'): number {
  const match = /^(\d+)(ms|s|m|h)?$/.exec(text)
  if (!match) throw new TypeError(`Expected \`${name}\` like 500ms, 90s, 10m or 1h, got ${text}.`)
  const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[match[2] ?? 's']!
  const value = Number(match[1]) * unit
  if (value < 1000) throw new TypeError(`Expected \`${name}\` to be at least 1s.`)
  return value
}

/** At least 5 s: more than the demo's 2 s lease in a chaos run (the engine refuses a retention within its lease). */
function parseRetention(text: string): number {
  const value = parseDuration(text, '--retention')
  if (value < 5_000) throw new TypeError('Expected `--retention` to be at least 5s (the lease is 2s).')
  return value
}

function parseFaults(text: string): FaultKind[] {
  if (text === 'none') return []
  const faults = text.split(',').map((f) => f.trim())
  for (const fault of faults) {
    if (!isFaultKind(fault)) {
      throw new TypeError(
        `Unknown fault \`${fault}\` in \`--faults\`; expected none or some of ${ALL_FAULT_KINDS.join(', ')}.`,
      )
    }
  }
  return [...new Set(faults)] as FaultKind[]
}

function onOff(name: string, text: string | undefined): boolean {
  if (text === undefined || text === 'on') return true
  if (text === 'off') return false
  throw new TypeError(`Expected \`${name}\` to be on or off, got ${text}.`)
}

function parseReservation(value: string | undefined): 'row' | 'lock' {
  return oneOf('--reservation', value, ['lock', 'row'])
}

/** `value` when it is one of `allowed`; the first of them when unset. */
function oneOf<const T extends string>(
  name: string,
  value: string | undefined,
  allowed: readonly [T, ...T[]],
): T {
  if (value === undefined) return allowed[0]
  if ((allowed as readonly string[]).includes(value)) return value as T
  throw new TypeError(`Expected \`${name}\` to be ${allowed.join(' or ')}, got ${value}.`)
}
