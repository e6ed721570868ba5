// Every datasource the contract suite (contract.test.ts) runs under, each as the same small shape: a datasource on a
// database URL, and the business writes and counts made through that library itself, so an effect counted by a test
// is one the library made in the handler's transaction. vitest.config.ts runs the suite once per datasource and
// protocol (ONCELY_TEST_DATASOURCE names the entry).
import { PGlite, type Transaction } from '@electric-sql/pglite'
import pg from 'pg'
import { type Database, nodePostgres } from '../../src/index.js'
import { pglite } from '../../src/pglite/index.js'

/** One library under test. */
export interface DatasourceUnderTest<Tx = unknown> {
  /** The datasource of the engine under test. */
  database: Database<Tx>
  /**
   * A second datasource of the same library on the same database with connections of its own (what `steps()` and
   * other layers that open transactions of their own are given).
   */
  second: Database<Tx>
  /** Books one payment for `cart` through the library, in `tx`. */
  pay(tx: Tx, cart: string): Promise<void>
  /** Payments booked for `cart`, counted through the library. */
  payments(cart: string): Promise<number>
  /** Closes what it opened. */
  close(): Promise<void>
}

/** Opens a library on a database whose `payments (tenant text, cart text, amount integer)` table exists. */
export type OpenDatasource = (url: string) => Promise<DatasourceUnderTest>

/**
 * The writes of the sabotaged run (ONCELY_TEST_SABOTAGE=second-connection): `pay` writes through the library's
 * own handle, outside the handler's transaction, as a handler that forgot `ctx.tx` would. The suite must fail then:
 * it is how it shows it can see the crash window a datasource guards.
 */
export const sabotaged = process.env.ONCELY_TEST_SABOTAGE === 'second-connection'

function nodePostgresUnderTest(url: string): Promise<DatasourceUnderTest<pg.PoolClient>> {
  const pool = new pg.Pool({ connectionString: url, max: 10 })
  const secondPool = new pg.Pool({ connectionString: url, max: 5 })
  for (const each of [pool, secondPool]) each.on('error', () => {})
  return Promise.resolve({
    database: nodePostgres({ pool }),
    second: nodePostgres({ pool: secondPool }),
    async pay(tx, cart) {
      const on = sabotaged ? pool : tx
      await on.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 100)', ['t', cart])
    },
    async payments(cart) {
      const { rows } = await pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [cart])
      return rows[0].n
    },
    async close() {
      await Promise.all([pool.end(), secondPool.end()])
    },
  })
}

/**
 * PGlite, in memory, on a database of its own (the URL is not used): the suite creates its tables through the
 * datasource. It has one connection, so there is no `second` of its own (the cases that need one are left out, see
 * contract.test.ts). A sabotaged `pay` cannot wait for its write: outside the transaction it would wait for the
 * connection the handler's own transaction holds, for ever. It sends the write without waiting, which then commits
 * after the transaction ended, whatever its outcome.
 */
async function pgliteUnderTest(): Promise<DatasourceUnderTest<Transaction>> {
  const db = await PGlite.create()
  const database = pglite({ db })
  const insert = 'INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 100)'
  return {
    database,
    second: database,
    async pay(tx, cart) {
      if (sabotaged) void db.query(insert, ['t', cart]).catch(() => {})
      else await tx.query(insert, ['t', cart])
    },
    async payments(cart) {
      const { rows } = await db.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM payments WHERE cart = $1',
        [cart],
      )
      return rows[0]?.n ?? 0
    },
    close: () => db.close(),
  }
}

/** The datasources by the name ONCELY_TEST_DATASOURCE takes. */
export const datasources: Record<string, OpenDatasource> = {
  'node-postgres': nodePostgresUnderTest as OpenDatasource,
  pglite: pgliteUnderTest as OpenDatasource,
}

/**
 * The datasources of a single connection (`Database.oneConnection`): the contract suite leaves out the cases that
 * need a second connection or a second process on the same database, each saying why.
 */
export const oneConnection: ReadonlySet<string> = new Set(['pglite'])

/** The datasource this run of the suite tests. */
export const datasourceName = process.env.ONCELY_TEST_DATASOURCE ?? 'node-postgres'

export function openDatasource(url: string): Promise<DatasourceUnderTest> {
  const open = datasources[datasourceName]
  if (!open) throw new Error(`Unknown ONCELY_TEST_DATASOURCE ${JSON.stringify(datasourceName)}.`)
  return open(url)
}
