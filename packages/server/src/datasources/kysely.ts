// The Kysely datasource: the seam (store/database.ts) over a `Kysely<DB>` with Kysely's PostgresDialect (on a
// `pg.Pool`), by way of callbackDatabase. The handler's transaction is Kysely's own `Transaction<DB>`. Kysely's
// Postgres driver rejects with node-postgres's error itself (SQLSTATE as `code`), so errors need no translation.
import { CompiledQuery, type Kysely, type QueryResult, type Transaction } from 'kysely'
import type pg from 'pg'
import { objectOptions } from '../options/check.js'
import type { Database, Rows, Statement } from '../store/database.js'
import { sideLane } from '../store/side-lane.js'
import { callbackDatabase } from './callback-database.js'
import { guardPool } from './node-postgres.js'

/** Options of {@link kyselyDatabase}. */
export interface KyselyOptions<DB> {
  /** Your Kysely instance, with Kysely's `PostgresDialect`, on the database that holds your business tables too. */
  db: Kysely<DB>
  /**
   * The `pg.Pool` of `db`'s `PostgresDialect`, which oncely never ends. Kysely does not show it, and oncely needs it
   * twice: to keep a client that loses its connection inside a transaction (a stalled attempt's, ended by Postgres
   * after its lease) from crashing the process with an unhandled `'error'` event, which Kysely does not listen for;
   * and to open its side lane with the same settings (at most two connections of its own, where a renewed lease or
   * a recovery point commits while every attempt in flight may hold a connection of the pool).
   * @example
   * const pool = new pg.Pool({ connectionString })
   * kyselyDatabase({ db: new Kysely<DB>({ dialect: new PostgresDialect({ pool }) }), pool })
   */
  pool: pg.Pool
}

const isKysely = (value: unknown): value is Kysely<unknown> =>
  typeof (value as Kysely<unknown> | undefined)?.executeQuery === 'function' &&
  typeof (value as Kysely<unknown>).transaction === 'function'

const rowsOf = (result: QueryResult<unknown>): Rows => ({
  rows: result.rows as Record<string, unknown>[],
  // Kysely counts affected rows for writes only; for a read, the rows it returned.
  rowCount: result.numAffectedRows === undefined ? result.rows.length : Number(result.numAffectedRows),
})

const compiled = (statement: Statement) => CompiledQuery.raw(statement.text, [...statement.values])

/**
 * The Kysely datasource: `ctx.tx` is Kysely's `Transaction<DB>`, typed with your `DB`.
 *
 * @example
 * const pool = new pg.Pool({ connectionString })
 * const db = new Kysely<DB>({ dialect: new PostgresDialect({ pool }) })
 * const engine = createEngine({ store: postgresStore({ database: kyselyDatabase({ db, pool }) }) })
 */
export function kyselyDatabase<DB>(options: KyselyOptions<DB>): Database<Transaction<DB>> {
  objectOptions('kyselyDatabase()', options)
  const { db, pool } = options
  if (!isKysely(db)) throw new TypeError('Expected `db` to be a Kysely instance.')
  if (typeof pool?.connect !== 'function' || typeof pool.query !== 'function')
    throw new TypeError("Expected `pool` to be the pg.Pool of `db`'s PostgresDialect.")
  guardPool(pool)
  return callbackDatabase<Transaction<DB>>({
    library: 'kysely',
    source: pool,
    transaction: (work) => db.transaction().execute(work),
    execute: async (tx, statement) => rowsOf(await tx.executeQuery(compiled(statement))),
    query: async (statement) => rowsOf(await db.executeQuery(compiled(statement))),
    side: async (statement) => {
      const { rows, rowCount } = await sideLane(pool).query(statement.text, [...statement.values])
      return { rows, rowCount: rowCount ?? rows.length }
    },
    isTransaction: (tx): tx is Transaction<DB> => isKysely(tx) && (tx as Kysely<DB>).isTransaction === true,
  })
}
