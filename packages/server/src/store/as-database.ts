import type pg from 'pg'
import { nodePostgres } from '../datasources/node-postgres.js'
import type { Database } from './database.js'

/**
 * The datasource a layer was given: a datasource as is, a node-postgres pool through `nodePostgres`. A TypeError
 * naming `where` otherwise.
 */
export function asDatabase<Tx = pg.PoolClient>(on: pg.Pool | Database<Tx>, where: string): Database<Tx> {
  if (typeof (on as Database | undefined)?.session === 'function') return on as Database<Tx>
  if (
    typeof (on as pg.Pool | undefined)?.connect === 'function' &&
    typeof (on as pg.Pool).query === 'function'
  ) {
    return nodePostgres({ pool: on as pg.Pool }) as unknown as Database<Tx>
  }
  throw new TypeError(
    `Expected ${where} to be given a pg.Pool or a datasource (such as nodePostgres({ pool })).`,
  )
}
