import type pg from 'pg'
import { nodePostgres } from '../datasources/node-postgres.js'
import type { Database } from '../store/database.js'

/** Whether `value` has what a node-postgres pool is used for. */
export function isPgPool(value: unknown): value is pg.Pool {
  const pool = value as pg.Pool | undefined
  return typeof pool?.connect === 'function' && typeof pool.query === 'function'
}

/**
 * The datasource of a factory that takes `pool` (node-postgres) or `database` (any datasource), exactly one of
 * them; a TypeError naming the option and `factory` otherwise. `fromPool` wraps the pool (default `nodePostgres`).
 */
export function poolOrDatabase<Tx = pg.PoolClient>(
  factory: string,
  options: { pool?: pg.Pool | undefined; database?: Database<Tx> | undefined },
  fromPool: (pool: pg.Pool) => Database<Tx> = (pool) => nodePostgres({ pool }) as unknown as Database<Tx>,
): Database<Tx> {
  const { pool, database } = options
  if (pool !== undefined && database !== undefined) {
    throw new TypeError(`Expected either \`pool\` or \`database\` in the options of ${factory}, not both.`)
  }
  if (database !== undefined) {
    if (typeof database?.session !== 'function' || typeof database.query !== 'function') {
      throw new TypeError('Expected `database` to be a datasource, such as nodePostgres({ pool }).')
    }
    return database
  }
  if (pool === undefined) {
    throw new TypeError(
      `Expected \`pool\` (a pg.Pool) or \`database\` (a datasource, such as drizzleDatabase({ db })) in the options of ${factory}.`,
    )
  }
  if (!isPgPool(pool)) {
    throw new TypeError(
      'Expected `pool` to be a pg.Pool (for another library, pass its datasource as `database`).',
    )
  }
  return fromPool(pool)
}
