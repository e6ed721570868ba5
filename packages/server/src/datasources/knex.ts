// The Knex datasource: the seam (store/database.ts) over a Knex instance of the `pg` client, by way of
// callbackDatabase. The handler's transaction is Knex's own `Knex.Transaction`. Knex rejects with node-postgres's
// error (its message prefixed with the query), so Postgres's SQLSTATE stays its `code`; and Knex listens for
// `'error'` on its connections itself, so a connection lost inside a transaction fails its next query only.
import createKnex, { type Knex } from 'knex'
import { objectOptions } from '../options/check.js'
import type { Database, Rows, Statement } from '../store/database.js'
import { SIDE_LANE_CONNECTIONS } from '../store/side-lane.js'
import { callbackDatabase } from './callback-database.js'

/** Options of {@link knexDatabase}. */
export interface KnexOptions {
  /**
   * Your Knex instance, with the `pg` client, on the database that holds your business tables too. oncely never
   * destroys it. Its side lane is a second Knex instance of the same configuration with at most two connections,
   * opened when first needed and emptied when idle (for what must commit on its own while every attempt in flight
   * may hold a connection of yours: a renewed lease, a recovery point).
   * @example
   * knexDatabase({ knex: knex({ client: 'pg', connection: process.env.DATABASE_URL }) })
   */
  knex: Knex
}

/** How long an idle side-lane connection is kept (as the node-postgres side lane does). */
const SIDE_LANE_IDLE_MS = 10_000

/**
 * Knex's bindings are `?` placeholders: the statement's `$1`, `$2`... become `?` in order of appearance (a
 * parameter used twice is bound twice), and a `?` of its own (a comment, the jsonb `?` operator) is escaped.
 */
function raw(on: Knex | Knex.Transaction, statement: Statement): Knex.Raw {
  const bindings: unknown[] = []
  const text = statement.text.replace(/\?/g, '\\?').replace(/\$(\d+)/g, (_, n: string) => {
    bindings.push(statement.values[Number(n) - 1])
    return '?'
  })
  return on.raw(text, bindings as Knex.RawBinding[])
}

const rowsOf = (result: { rows?: Record<string, unknown>[]; rowCount?: number | null }): Rows => {
  const rows = result.rows ?? []
  return { rows, rowCount: result.rowCount ?? rows.length }
}

const isKnex = (value: unknown): value is Knex =>
  typeof value === 'function' &&
  typeof (value as Knex).raw === 'function' &&
  typeof (value as Knex).transaction === 'function'

/**
 * The Knex datasource: `ctx.tx` is Knex's `Knex.Transaction`.
 *
 * @example
 * const db = knex({ client: 'pg', connection: process.env.DATABASE_URL })
 * const engine = createEngine({ store: postgresStore({ database: knexDatabase({ knex: db }) }) })
 */
export function knexDatabase(options: KnexOptions): Database<Knex.Transaction> {
  objectOptions('knexDatabase()', options)
  const { knex } = options
  if (!isKnex(knex)) throw new TypeError('Expected `knex` to be a Knex instance.')
  if (knex.client?.dialect !== 'postgresql')
    throw new TypeError(
      `Expected \`knex\` to be a Knex instance of the 'pg' client, not of ${JSON.stringify(knex.client?.dialect)}.`,
    )
  let side: Knex | undefined
  const sideLane = () => {
    if (!side) {
      const config = knex.client.config as Knex.Config
      side = createKnex({
        ...config,
        pool: { ...config.pool, min: 0, max: SIDE_LANE_CONNECTIONS, idleTimeoutMillis: SIDE_LANE_IDLE_MS },
      })
    }
    return side
  }
  return callbackDatabase<Knex.Transaction>({
    library: 'knex',
    source: knex,
    transaction: (work) => knex.transaction(work),
    execute: async (tx, statement) => rowsOf(await raw(tx, statement)),
    query: async (statement) => rowsOf(await raw(knex, statement)),
    side: async (statement) => rowsOf(await raw(sideLane(), statement)),
    isTransaction: (tx): tx is Knex.Transaction =>
      isKnex(tx) && (tx as Knex.Transaction).isTransaction === true,
  })
}
