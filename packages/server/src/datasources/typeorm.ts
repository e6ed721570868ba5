// The TypeORM datasource: the seam (store/database.ts) over an initialized TypeORM 0.3 `DataSource` of type
// 'postgres', by way of callbackDatabase. The handler's transaction is TypeORM's own `EntityManager`, the one
// `dataSource.transaction()` hands out. TypeORM wraps node-postgres's errors in a `QueryFailedError` that keeps the
// driver's error as `driverError` (and copies its fields); the SQLSTATE is made sure to stay `code`.
import type pg from 'pg'
import type { DataSource, EntityManager, QueryRunner } from 'typeorm'
import { objectOptions } from '../options/check.js'
import type { Database, Rows, Statement } from '../store/database.js'
import { sideLane } from '../store/side-lane.js'
import { callbackDatabase } from './callback-database.js'
import { guardPool } from './node-postgres.js'

/** Options of {@link typeormDatabase}. */
export interface TypeormOptions {
  /**
   * Your TypeORM `DataSource` of type `'postgres'`, already initialized (`await dataSource.initialize()`), on the
   * database that holds your business tables too. oncely never destroys it. It adds an `'error'` listener to the
   * pool under it, and opens its side lane (at most two connections, closed when idle) with that pool's settings.
   * @example
   * typeormDatabase({ dataSource: await new DataSource({ type: 'postgres', url, entities }).initialize() })
   */
  dataSource: DataSource
}

/** The statement on `runner`, as rows and a row count. Rejects with Postgres's SQLSTATE as `code`. */
async function run(runner: QueryRunner, statement: Statement): Promise<Rows> {
  try {
    const result = await runner.query(statement.text, [...statement.values], true)
    const rows = (result.records ?? []) as Record<string, unknown>[]
    return { rows, rowCount: result.affected ?? rows.length }
  } catch (error) {
    const driverCode = (error as { driverError?: { code?: unknown } } | null)?.driverError?.code
    if (typeof driverCode === 'string' && (error as { code?: unknown }).code === undefined)
      Object.assign(error as object, { code: driverCode })
    throw error
  }
}

/**
 * The TypeORM datasource: `ctx.tx` is TypeORM's `EntityManager` of the open transaction.
 *
 * @example
 * const dataSource = await new DataSource({ type: 'postgres', url: process.env.DATABASE_URL, entities }).initialize()
 * const engine = createEngine({ store: postgresStore({ database: typeormDatabase({ dataSource }) }) })
 */
export function typeormDatabase(options: TypeormOptions): Database<EntityManager> {
  objectOptions('typeormDatabase()', options)
  const { dataSource } = options
  if (typeof dataSource?.transaction !== 'function' || typeof dataSource.createQueryRunner !== 'function')
    throw new TypeError('Expected `dataSource` to be a TypeORM DataSource.')
  if (dataSource.options.type !== 'postgres')
    throw new TypeError(
      `Expected \`dataSource\` to be of type 'postgres', not ${JSON.stringify(dataSource.options.type)}.`,
    )
  if (!dataSource.isInitialized)
    throw new TypeError('Expected `dataSource` to be initialized: await dataSource.initialize() first.')
  const pool = (dataSource.driver as unknown as { master?: pg.Pool }).master
  if (typeof pool?.connect !== 'function' || typeof pool.on !== 'function')
    throw new TypeError(
      'Expected `dataSource` to reach Postgres through the `pg` driver (its pool was not found).',
    )
  guardPool(pool)
  return callbackDatabase<EntityManager>({
    library: 'typeorm',
    source: pool,
    transaction: (work) => dataSource.transaction(work),
    execute: (tx, statement) => {
      if (!tx.queryRunner)
        throw new TypeError('Expected `tx` to be the EntityManager of a TypeORM transaction.')
      return run(tx.queryRunner, statement)
    },
    async query(statement) {
      const runner = dataSource.createQueryRunner()
      try {
        return await run(runner, statement)
      } finally {
        await runner.release()
      }
    },
    side: async (statement) => {
      const { rows, rowCount } = await sideLane(pool).query(statement.text, [...statement.values])
      return { rows, rowCount: rowCount ?? rows.length }
    },
    isTransaction: (tx): tx is EntityManager =>
      typeof (tx as EntityManager | undefined)?.getRepository === 'function' &&
      typeof (tx as EntityManager).transaction === 'function' &&
      (tx as EntityManager).queryRunner?.isTransactionActive === true,
  })
}
