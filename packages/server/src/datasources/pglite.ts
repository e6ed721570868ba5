// The PGlite datasource: the seam (store/database.ts) over a PGlite instance, Postgres compiled to WASM and run in
// the process, for tests of routes that use oncely without a Postgres server. The handler's transaction is PGlite's
// own `Transaction`.
//
// PGlite has one connection. Its transactions run one at a time: `db.transaction()` waits for the one before it,
// and so does `db.query()` outside a transaction. An attempt's session begins its transaction at its BEGIN step and
// holds the connection until its COMMIT or ROLLBACK (callback-database.ts); every other attempt queues meanwhile, in
// order, and finds the key finished or free when its turn comes. What must commit on its own beside an open
// transaction (the side lane) cannot: no second connection exists, and waiting for the holder from inside it would
// never end. So the datasource says it has one connection (`oneConnection`): the engine renews no lease while a
// transaction holds it (nothing else can reach the key meanwhile) and arms no lease guard (a stalled process stalls
// its database too, so no one could take the key over; and PGlite's idle timer hangs the instance when it fires),
// and `side` refuses at once while a transaction is open instead of waiting for it.
import type { PGliteInterface, Results, Transaction } from '@electric-sql/pglite'
import { objectOptions } from '../options/check.js'
import type { Database, Rows, Statement } from '../store/database.js'
import { callbackDatabase } from './callback-database.js'

/** Options of {@link pglite}. */
export interface PGliteOptions {
  /**
   * Your PGlite instance (`new PGlite()`, or `await PGlite.create()`), which holds your business tables too. oncely
   * never closes it.
   * @example
   * pglite({ db: new PGlite() }) // in memory: a fresh database per test file
   */
  db: PGliteInterface
}

/** SQLSTATE 25001 (active_sql_transaction): a transaction holds PGlite's only connection. */
const ACTIVE_TRANSACTION = '25001'

const databases = new WeakMap<PGliteInterface, Database<Transaction>>()

/**
 * The PGlite datasource, for tests: `ctx.tx` is PGlite's `Transaction`. One per instance (calling it again returns
 * the same object). Both reservation protocols work on it; its one connection serialises every transaction, so a
 * duplicate sent while the first request runs waits for it and replays its answer instead of being told 409.
 *
 * @example
 * import { PGlite } from '@electric-sql/pglite'
 * import { pglite } from '@oncely/server/pglite'
 *
 * const database = pglite({ db: new PGlite() })
 * await migrate(database)
 * const engine = createEngine({ store: postgresStore({ database }) })
 */
export function pglite(options: PGliteOptions): Database<Transaction> {
  objectOptions('pglite()', options)
  const { db } = options
  if (typeof db?.query !== 'function' || typeof db.transaction !== 'function') {
    throw new TypeError('Expected `db` to be a PGlite instance.')
  }
  let database = databases.get(db)
  if (!database) {
    database = createDatabase(db)
    databases.set(db, database)
  }
  return database
}

function createDatabase(db: PGliteInterface): Database<Transaction> {
  const rowsOf = (result: Results): Rows => ({
    rows: result.rows as Record<string, unknown>[],
    rowCount: result.rowCount ?? result.affectedRows ?? 0,
  })
  const values = (statement: Statement) => statement.values as unknown[]
  /** Transactions of this datasource open (or waiting for the connection) right now. */
  let open = 0
  const transaction = async <T>(work: (tx: Transaction) => Promise<T>): Promise<T> => {
    open++
    try {
      return await db.transaction(work)
    } finally {
      open--
    }
  }
  const database = callbackDatabase<Transaction>({
    library: 'PGlite',
    source: db,
    transaction,
    execute: async (tx, statement) => rowsOf(await tx.query(statement.text, values(statement))),
    query: async (statement) => rowsOf(await db.query(statement.text, values(statement))),
    async side(statement) {
      if (open > 0) {
        throw Object.assign(
          new Error(
            "PGlite has one connection, and a transaction holds it: a statement that must commit on its own (a recovery point saved without a transaction) cannot run beside it, and waiting for it from inside would never end. Save the recovery point in the handler's transaction instead: ctx.saveRecoveryPoint(point, ctx.tx).",
          ),
          { code: ACTIVE_TRANSACTION },
        )
      }
      return rowsOf(await db.query(statement.text, values(statement)))
    },
    isTransaction: (tx): tx is Transaction =>
      typeof (tx as Transaction | undefined)?.query === 'function' &&
      typeof (tx as Transaction).rollback === 'function' &&
      typeof (tx as Transaction).exec === 'function',
  })
  return { ...database, oneConnection: true }
}
