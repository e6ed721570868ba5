// The Drizzle datasource: the seam over a Drizzle Postgres database (over node-postgres or over postgres.js),
// through callback-database.ts. The handler's transaction is the `PgTransaction` of `db.transaction(async (tx) =>
// ...)`; oncely's statements go through Drizzle (`tx.execute`) in it.
import { is, type SQL, sql } from 'drizzle-orm'
import { type PgDatabase, type PgQueryResultHKT, PgTransaction } from 'drizzle-orm/pg-core'
import type pg from 'pg'
import { objectOptions } from '../options/check.js'
import type { Database, Rows, Statement } from '../store/database.js'
import { callbackDatabase } from './callback-database.js'
import { nodePostgres } from './node-postgres.js'
import { asSent, postgresJs } from './postgres-js.js'

// biome-ignore lint/suspicious/noExplicitAny: any schema of the user's
type AnyPgDatabase = PgDatabase<PgQueryResultHKT, any, any>

/** The transaction type of a Drizzle database: what `db.transaction` hands its callback. */
export type DrizzleTransaction<DB> =
  DB extends PgDatabase<infer Result, infer Full, infer Schema> ? PgTransaction<Result, Full, Schema> : never

/** Options of {@link drizzle}. */
export interface DrizzleOptions<DB> {
  /**
   * Your Drizzle database (`drizzle(pool)` of `drizzle-orm/node-postgres`, or `drizzle(sql)` of
   * `drizzle-orm/postgres-js`), on the database that holds your business tables too. oncely never ends its client.
   */
  db: DB
}

const databases = new WeakMap<object, Database<unknown>>()

/**
 * The Drizzle datasource: `ctx.tx` is the Drizzle transaction of the attempt (typed with your schema). Its side lane
 * (a few connections of its own) is opened from the client under `db`: a `pg.Pool`, or a postgres.js instance. One
 * per database (calling it again with the same `db` returns the same object).
 *
 * @example
 * import { drizzle as drizzleOrm } from 'drizzle-orm/node-postgres'
 * import { drizzle } from '@oncely/server/drizzle'
 *
 * const db = drizzleOrm(pool)
 * const engine = createEngine({ store: postgresStore({ database: drizzle({ db }) }) })
 * // in a handler: await ctx.tx.insert(payments).values({ cart })
 */
export function drizzle<DB extends AnyPgDatabase>(
  options: DrizzleOptions<DB>,
): Database<DrizzleTransaction<DB>> {
  objectOptions('drizzle()', options)
  const { db } = options
  if (typeof db?.transaction !== 'function' || typeof db.execute !== 'function')
    throw new TypeError(
      'Expected `db` to be a Drizzle Postgres database (`drizzle(pool)` or `drizzle(sql)`).',
    )
  const known = databases.get(db)
  if (known) return known as Database<DrizzleTransaction<DB>>
  const driver = driverOf(db)
  const send = (on: AnyPgDatabase, statement: Statement) => run(on, statement, driver)
  const database = callbackDatabase<DrizzleTransaction<DB>>({
    library: 'drizzle',
    source: driver.client,
    transaction: (work) => db.transaction((tx) => work(tx as DrizzleTransaction<DB>)),
    execute: (tx, statement) => send(tx as AnyPgDatabase, statement),
    query: (statement) => send(db, statement),
    side: (statement) => driver.side(statement),
    // A nested Drizzle transaction is a savepoint.
    savepoint: (tx, work) => tx.transaction((inner) => work(inner as DrizzleTransaction<DB>)),
    isTransaction: (tx): tx is DrizzleTransaction<DB> => is(tx, PgTransaction),
  })
  databases.set(db, database as Database<unknown>)
  return database
}

interface Driver {
  /** The client under the Drizzle database. */
  client: object
  /** Runs a statement on the side lane, through the client's own library. */
  side(statement: Statement): Promise<Rows>
  /** The statement as Drizzle's driver must be given it. */
  adapt(statement: Statement): { text: string; values: readonly unknown[] }
}

/** The client under `db` (Drizzle's `$client`), and how statements are sent through its library. */
function driverOf(db: AnyPgDatabase): Driver {
  const client = (db as { $client?: unknown }).$client
  if (typeof client === 'function' && typeof (client as { unsafe?: unknown }).unsafe === 'function') {
    const sqlClient = client as Parameters<typeof postgresJs>[0]['sql']
    const lane = postgresJs({ sql: sqlClient })
    return {
      client: sqlClient,
      side: (statement) => lane.side(statement),
      adapt: (statement) => asSent(statement, sqlClient.options.serializers as never),
    }
  }
  const pool = client as pg.Pool | undefined
  if (typeof pool?.connect === 'function' && typeof pool.query === 'function' && 'totalCount' in pool) {
    const lane = nodePostgres({ pool })
    return {
      client: pool,
      side: (statement) => lane.side(statement),
      adapt: (statement) => statement,
    }
  }
  throw new TypeError(
    'Expected `db` to be a Drizzle database over a pg.Pool (drizzle-orm/node-postgres) or a postgres.js instance (drizzle-orm/postgres-js).',
  )
}

/**
 * Runs a statement through Drizzle: its text, with each `$n` as a Drizzle parameter (Drizzle numbers them again).
 * Drizzle wraps a driver's error in its own (`DrizzleQueryError`); the driver's, which carries Postgres's SQLSTATE
 * as `code`, is what the engine is given.
 */
async function run(on: AnyPgDatabase, statement: Statement, driver: Driver): Promise<Rows> {
  const { text, values } = driver.adapt(statement)
  let result: unknown
  try {
    result = await on.execute(toSql(text, values))
  } catch (error) {
    const cause = (error as { cause?: unknown } | null)?.cause
    throw typeof (cause as { code?: unknown } | undefined)?.code === 'string' ? cause : error
  }
  return rowsOf(result)
}

const PLACEHOLDER = /\$(\d+)(?!\d)/g

/** A statement's text with `$n` placeholders as a Drizzle `SQL` of raw text and parameters. */
export function toSql(text: string, values: readonly unknown[]): SQL {
  if (values.length === 0) return sql.raw(text)
  const chunks: SQL[] = []
  let from = 0
  for (const match of text.matchAll(PLACEHOLDER)) {
    chunks.push(sql.raw(text.slice(from, match.index)), sql`${sql.param(values[Number(match[1]) - 1])}`)
    from = match.index + match[0].length
  }
  chunks.push(sql.raw(text.slice(from)))
  return sql.join(chunks)
}

/**
 * The rows of what Drizzle's driver answered: a node-postgres result (`rows`, `rowCount`), or a postgres.js one (an
 * array with `count`); for a message of several statements, an array of them, of which the last counts.
 */
function rowsOf(result: unknown): Rows {
  let last = result as { rows?: unknown[]; rowCount?: number | null; count?: number | null } | unknown[]
  if (Array.isArray(last) && !('count' in last) && last.length > 0) last = last[last.length - 1] as never
  if (Array.isArray(last)) {
    return {
      rows: [...last] as Record<string, unknown>[],
      rowCount: (last as { count?: number | null }).count ?? 0,
    }
  }
  const { rows = [], rowCount } = last as { rows?: Record<string, unknown>[]; rowCount?: number | null }
  return { rows, rowCount: rowCount ?? 0 }
}
