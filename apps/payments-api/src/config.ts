/**
 * The demo's configuration, read from environment variables once at start and validated, so a typo fails at boot
 * with a message naming the variable instead of misbehaving later.
 */

/** Places in the request path where the chaos suite can kill or pause the process. In protocol order. */
export const CHAOS_POINTS = [
  'after-reserve',
  'after-provider',
  'after-business-write',
  'before-commit',
  'after-commit',
  'after-reply',
] as const

/** One of {@link CHAOS_POINTS}. */
export type ChaosPoint = (typeof CHAOS_POINTS)[number]

/** Fault injection for the chaos suite. Only ever active when `ONCELY_CHAOS=1`. */
export interface ChaosConfig {
  /** Points at which the process kills itself with SIGKILL (`ONCELY_CRASH_AT`, comma separated). */
  crashAt: ReadonlySet<ChaosPoint>
  /** Probability of crashing at each of `crashAt` (`ONCELY_CRASH_RATE`). @default 1 */
  crashRate: number
  /** Points at which the request is held for `delayMs` (`ONCELY_DELAY_AT`, comma separated). */
  delayAt: ReadonlySet<ChaosPoint>
  /** How long a delay holds the request, in ms (`ONCELY_DELAY_MS`). @default 0 */
  delayMs: number
  /** Probability of delaying at each of `delayAt` (`ONCELY_DELAY_RATE`). @default 1 */
  delayRate: number
  /** Seed for the crash and delay draws, so a run can be replayed (`ONCELY_CHAOS_SEED`). Random when unset. */
  seed: number | undefined
  /** Serve the route without idempotency, so the suite can prove it catches duplicates. `ONCELY_UNSAFE_DISABLE_IDEMPOTENCY=1` */
  disableIdempotency: boolean
  /** Turn off the engine's fencing, so the suite can prove it catches a paused process. `ONCELY_UNSAFE_DISABLE_FENCING=1` */
  disableFencing: boolean
  /**
   * Drop the ledger's natural key (one payment per tenant and charge) at start, so the suite can prove it catches a
   * retry after key expiry booking a second payment. `ONCELY_UNSAFE_DISABLE_BACKSTOP=1`
   */
  disableBackstop: boolean
}

/** The simulated payment provider's behaviour. */
export interface ProviderConfig {
  /** Time each charge takes, in ms (`ONCELY_PROVIDER_DELAY_MS`). @default 0 */
  delayMs: number
  /** Probability that a charge fails with a transient error (`ONCELY_PROVIDER_FAILURE_RATE`, 0 to 1). @default 0 */
  failureRate: number
}

/** Everything the payments API reads from its environment. */
export interface Config {
  /** TCP port (`PORT`). 0 picks a free one. @default 3000 */
  port: number
  /** Interface to listen on (`HOST`). @default '127.0.0.1' */
  host: string
  /** Postgres connection string (`DATABASE_URL`). Unset: an embedded Postgres with its data under `.data/postgres`. */
  databaseUrl: string | undefined
  /**
   * What `DATABASE_URL` reaches (`DATABASE_POOLER`): `none`, Postgres itself, or `transaction`, a pooler in
   * transaction mode (PgBouncer, RDS Proxy...), where the next statement may reach another server connection: the
   * idempotency store then sends its statements unnamed (`preparedStatements: false`). @default 'none'
   */
  pooler: 'none' | 'transaction'
  /**
   * Connections of the API's own pool (`DATABASE_POOL_SIZE`): the business transactions and the idempotency store's
   * statements. The payment steps and the simulated provider have pools of their own. @default 20
   */
  poolSize: number
  /**
   * How the database is laid out (`DATABASE_DISTRIBUTION`): `none`, one Postgres, or `citus`, the coordinator of a
   * Citus cluster: at start-up the API then distributes its tables by tenant (payments, outbox, and oncely's key
   * table and outbox, co-located), so each request commits on the node holding its tenant. @default 'none'
   */
  distribution: 'none' | 'citus'
  /**
   * The simulated provider's own Postgres (`PROVIDER_DATABASE_URL`): a real provider is another system, which keeps
   * its charges whatever happens to this API's database (a failover, a restore). @default DATABASE_URL
   */
  providerDatabaseUrl: string | undefined
  /** How long a reservation is held before another request may take it over, in ms (`ONCELY_LEASE_MS`). @default 30000 */
  leaseMs: number
  /** How long keys and stored responses are kept, in ms (`ONCELY_RETENTION_MS`). @default 86400000 (24 hours) */
  retentionMs: number
  /** The engine's reservation protocol, `lock` or `row` (`ONCELY_RESERVATION`; see @oncely/server). @default 'lock' */
  reservation: 'row' | 'lock'
  /**
   * Answer replays of finished keys from the engine's in-process cache (`ONCELY_REPLAY_CACHE=0` turns it off).
   * @default true
   */
  replayCache: boolean
  /** Fastify's log level (`LOG_LEVEL`). @default 'info' */
  logLevel: string
  /** See {@link ProviderConfig}. */
  provider: ProviderConfig
  /** Fault injection; `undefined` unless `ONCELY_CHAOS=1`. */
  chaos: ChaosConfig | undefined
}

/** A bad environment variable. The message names it and says what is expected. */
export class ConfigError extends Error {
  override name = 'ConfigError' as const
}

type Env = Record<string, string | undefined>

function integer(
  env: Env,
  name: string,
  fallback: number,
  min: number,
  max = Number.MAX_SAFE_INTEGER,
): number {
  const raw = env[name]
  if (raw === undefined || raw.trim() === '') return fallback
  const value = Number(raw)
  if (!/^\s*\d+\s*$/.test(raw) || value < min || value > max) {
    throw new ConfigError(`${name} must be an integer from ${min} to ${max}; got ${JSON.stringify(raw)}.`)
  }
  return value
}

function probability(env: Env, name: string, fallback: number): number {
  const raw = env[name]
  if (raw === undefined || raw.trim() === '') return fallback
  const value = Number(raw)
  if (!Number.isFinite(value) || value < 0 || value > 1) {
    throw new ConfigError(`${name} must be a number from 0 to 1; got ${JSON.stringify(raw)}.`)
  }
  return value
}

function reservation(env: Env): 'row' | 'lock' {
  const raw = env.ONCELY_RESERVATION?.trim()
  if (raw === undefined || raw === '' || raw === 'lock') return 'lock'
  if (raw === 'row') return 'row'
  throw new ConfigError(`ONCELY_RESERVATION must be lock or row; got ${JSON.stringify(raw)}.`)
}

function pooler(env: Env): 'none' | 'transaction' {
  const raw = env.DATABASE_POOLER?.trim()
  if (raw === undefined || raw === '' || raw === 'none') return 'none'
  if (raw === 'transaction') return 'transaction'
  throw new ConfigError(`DATABASE_POOLER must be none or transaction; got ${JSON.stringify(raw)}.`)
}

function distribution(env: Env): 'none' | 'citus' {
  const raw = env.DATABASE_DISTRIBUTION?.trim()
  if (raw === undefined || raw === '' || raw === 'none') return 'none'
  if (raw === 'citus') return 'citus'
  throw new ConfigError(`DATABASE_DISTRIBUTION must be none or citus; got ${JSON.stringify(raw)}.`)
}

function postgresUrl(env: Env, name: string): string | undefined {
  const url = env[name]?.trim() || undefined
  if (url !== undefined && !/^postgres(ql)?:\/\//.test(url)) {
    throw new ConfigError(`${name} must be a postgres:// or postgresql:// connection string.`)
  }
  return url
}

function flag(env: Env, name: string): boolean {
  const raw = env[name]
  if (raw === undefined || raw === '' || raw === '0') return false
  if (raw === '1') return true
  throw new ConfigError(`${name} must be 1 or 0; got ${JSON.stringify(raw)}.`)
}

function points(env: Env, name: string): ReadonlySet<ChaosPoint> {
  const raw = env[name]
  const result = new Set<ChaosPoint>()
  if (raw === undefined) return result
  for (const item of raw.split(',')) {
    const point = item.trim()
    if (point === '') continue
    if (!(CHAOS_POINTS as readonly string[]).includes(point)) {
      throw new ConfigError(
        `${name}: unknown point ${JSON.stringify(point)}; expected ${CHAOS_POINTS.join(', ')}.`,
      )
    }
    result.add(point as ChaosPoint)
  }
  return result
}

const CHAOS_ONLY = [
  'ONCELY_CRASH_AT',
  'ONCELY_DELAY_AT',
  'ONCELY_UNSAFE_DISABLE_IDEMPOTENCY',
  'ONCELY_UNSAFE_DISABLE_FENCING',
  'ONCELY_UNSAFE_DISABLE_BACKSTOP',
] as const

function chaos(env: Env): ChaosConfig | undefined {
  if (!flag(env, 'ONCELY_CHAOS')) {
    // A fault variable without the switch is almost certainly a mistake in a chaos run; say so instead of ignoring it.
    const stray = CHAOS_ONLY.find((name) => env[name] !== undefined && env[name] !== '')
    if (stray) throw new ConfigError(`${stray} only has an effect with ONCELY_CHAOS=1.`)
    return undefined
  }
  return {
    crashAt: points(env, 'ONCELY_CRASH_AT'),
    crashRate: probability(env, 'ONCELY_CRASH_RATE', 1),
    delayAt: points(env, 'ONCELY_DELAY_AT'),
    delayMs: integer(env, 'ONCELY_DELAY_MS', 0, 0, 600_000),
    delayRate: probability(env, 'ONCELY_DELAY_RATE', 1),
    seed: env.ONCELY_CHAOS_SEED ? integer(env, 'ONCELY_CHAOS_SEED', 0, 0, 2 ** 32 - 1) : undefined,
    disableIdempotency: flag(env, 'ONCELY_UNSAFE_DISABLE_IDEMPOTENCY'),
    disableFencing: flag(env, 'ONCELY_UNSAFE_DISABLE_FENCING'),
    disableBackstop: flag(env, 'ONCELY_UNSAFE_DISABLE_BACKSTOP'),
  }
}

/**
 * Reads and validates the configuration.
 *
 * @throws {ConfigError} naming the first bad variable.
 * @example
 * const config = loadConfig(process.env)
 */
export function loadConfig(env: Env = process.env): Config {
  const databaseUrl = postgresUrl(env, 'DATABASE_URL')
  const host = env.HOST?.trim() || '127.0.0.1'
  return {
    port: integer(env, 'PORT', 3000, 0, 65_535),
    host,
    databaseUrl,
    pooler: pooler(env),
    poolSize: integer(env, 'DATABASE_POOL_SIZE', 20, 1, 10_000),
    distribution: distribution(env),
    providerDatabaseUrl: postgresUrl(env, 'PROVIDER_DATABASE_URL') ?? databaseUrl,
    leaseMs: integer(env, 'ONCELY_LEASE_MS', 30_000, 1),
    retentionMs: integer(env, 'ONCELY_RETENTION_MS', 86_400_000, 1),
    reservation: reservation(env),
    replayCache:
      env.ONCELY_REPLAY_CACHE === undefined ||
      env.ONCELY_REPLAY_CACHE === '' ||
      flag(env, 'ONCELY_REPLAY_CACHE'),
    logLevel: env.LOG_LEVEL?.trim() || 'info',
    provider: {
      delayMs: integer(env, 'ONCELY_PROVIDER_DELAY_MS', 0, 0, 600_000),
      failureRate: probability(env, 'ONCELY_PROVIDER_FAILURE_RATE', 0),
    },
    chaos: chaos(env),
  }
}
