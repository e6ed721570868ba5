// Every variant the bench server can start, by name, loaded only when started (a peer or a library that cannot be
// imported leaves the others running). Each names the baseline its ratios are taken against: the route that does the
// same INSERT on the same framework and through the same library, without idempotency.
import type { Variant } from './variant.js'

export interface VariantEntry {
  load: () => Promise<Variant>
  /** The variant it is divided by; undefined for a baseline itself. */
  baseline?: string
  /**
   * The suite whose throughput runs measure it: `server` (the protocols, references and peers, at 1 and 10
   * connections) or `adapters` (the other HTTP adapters and the database libraries, at 10). `otel` variants run in a
   * server process of the otel suite's own.
   */
  suite: 'server' | 'adapters' | 'otel'
}

export const REGISTRY: Record<string, VariantEntry> = {
  baseline: { load: async () => (await import('./baseline.js')).baseline, suite: 'server' },
  'oncely-row': {
    load: async () => (await import('./oncely.js')).oncelyRow,
    baseline: 'baseline',
    suite: 'server',
  },
  'oncely-row-nocache': {
    load: async () => (await import('./oncely.js')).oncelyRowNoCache,
    baseline: 'baseline',
    suite: 'server',
  },
  'oncely-lock': {
    load: async () => (await import('./oncely.js')).oncelyLock,
    baseline: 'baseline',
    suite: 'server',
  },
  'oncely-lock-nocache': {
    load: async () => (await import('./oncely.js')).oncelyLockNoCache,
    baseline: 'baseline',
    suite: 'server',
  },
  'oncely-otel': {
    load: async () => (await import('./otel.js')).oncelyOtel,
    baseline: 'baseline',
    suite: 'otel',
  },
  'oncely-otel-noop': {
    load: async () => (await import('./otel.js')).oncelyOtelNoop,
    baseline: 'baseline',
    suite: 'otel',
  },
  'sql-floor': {
    load: async () => (await import('./sql-floor.js')).sqlFloor,
    baseline: 'baseline',
    suite: 'server',
  },
  'sql-floor-one-statement': {
    load: async () => (await import('./sql-floor.js')).sqlFloorOneStatement,
    baseline: 'baseline',
    suite: 'server',
  },
  'engine-floor': {
    load: async () => (await import('./oncely.js')).oncelyEngineOnly,
    baseline: 'baseline',
    suite: 'server',
  },
  'node-idempotency-pg': {
    load: async () => (await import('./node-idempotency.js')).nodeIdempotencyPostgres,
    baseline: 'baseline',
    suite: 'server',
  },
  'node-idempotency-redis': {
    load: async () => (await import('./node-idempotency.js')).nodeIdempotencyRedis,
    baseline: 'baseline',
    suite: 'server',
  },
  'powertools-redis': {
    load: async () => (await import('./powertools.js')).powertools,
    baseline: 'baseline',
    suite: 'server',
  },
  'express-baseline': { load: async () => (await import('./express.js')).expressBaseline, suite: 'adapters' },
  'oncely-express': {
    load: async () => (await import('./express.js')).oncelyExpress,
    baseline: 'express-baseline',
    suite: 'adapters',
  },
  'fetch-baseline': { load: async () => (await import('./fetch.js')).fetchBaseline, suite: 'adapters' },
  'oncely-fetch': {
    load: async () => (await import('./fetch.js')).oncelyFetch,
    baseline: 'fetch-baseline',
    suite: 'adapters',
  },
  'oncely-recovery-point': {
    load: async () => (await import('./recovery-point.js')).oncelyRecoveryPoint,
    baseline: 'baseline',
    suite: 'adapters',
  },
  'postgres-js-baseline': {
    load: async () => (await import('./datasources/postgres-js.js')).postgresJsBaseline,
    suite: 'adapters',
  },
  'oncely-postgres-js': {
    load: async () => (await import('./datasources/postgres-js.js')).oncelyPostgresJs,
    baseline: 'postgres-js-baseline',
    suite: 'adapters',
  },
  'drizzle-baseline': {
    load: async () => (await import('./datasources/drizzle.js')).drizzleBaseline,
    suite: 'adapters',
  },
  'oncely-drizzle': {
    load: async () => (await import('./datasources/drizzle.js')).oncelyDrizzle,
    baseline: 'drizzle-baseline',
    suite: 'adapters',
  },
  'kysely-baseline': {
    load: async () => (await import('./datasources/kysely.js')).kyselyBaseline,
    suite: 'adapters',
  },
  'oncely-kysely': {
    load: async () => (await import('./datasources/kysely.js')).oncelyKysely,
    baseline: 'kysely-baseline',
    suite: 'adapters',
  },
  'knex-baseline': {
    load: async () => (await import('./datasources/knex.js')).knexBaseline,
    suite: 'adapters',
  },
  'oncely-knex': {
    load: async () => (await import('./datasources/knex.js')).oncelyKnex,
    baseline: 'knex-baseline',
    suite: 'adapters',
  },
  'typeorm-baseline': {
    load: async () => (await import('./datasources/typeorm.js')).typeormBaseline,
    suite: 'adapters',
  },
  'oncely-typeorm': {
    load: async () => (await import('./datasources/typeorm.js')).oncelyTypeorm,
    baseline: 'typeorm-baseline',
    suite: 'adapters',
  },
  'prisma-baseline': {
    load: async () => (await import('./datasources/prisma.js')).prismaBaseline,
    suite: 'adapters',
  },
  'oncely-prisma': {
    load: async () => (await import('./datasources/prisma.js')).oncelyPrisma,
    baseline: 'prisma-baseline',
    suite: 'adapters',
  },
}

/** The variants `pnpm bench` starts by default: all but the otel suite's. */
export const VARIANT_NAMES = Object.keys(REGISTRY).filter((name) => REGISTRY[name]!.suite !== 'otel')

/** The baseline `name` is divided by (itself for a baseline). */
export const baselineOf = (name: string) => REGISTRY[name]?.baseline ?? name
