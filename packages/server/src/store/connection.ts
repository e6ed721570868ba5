// What both reservation protocols do with a pooled connection: prepare a statement once, send a query with or
// without a name, and end a transaction that turned out not to be needed.
import type pg from 'pg'
import { StoreSetupError } from '../errors.js'
import type { ResolvedStore } from './postgres-store.js'
import type { Query, SqlStatement } from './queries.js'

// Which SQL-level prepared statements each connection holds (module-wide: engines on one table share a name).
const preparedOn = new WeakMap<pg.ClientBase, Set<string>>()

/**
 * PREPAREs a statement on this connection the first time it is used there: on its own, so whether it exists never
 * depends on which statement of a later message failed (a PREPARE is not undone by a rollback).
 */
export async function prepare(client: pg.ClientBase, statement: SqlStatement): Promise<void> {
  let prepared = preparedOn.get(client)
  if (prepared?.has(statement.name)) return
  await client.query(statement.prepare)
  if (!prepared) {
    prepared = new Set()
    preparedOn.set(client, prepared)
  }
  prepared.add(statement.name)
}

/** Rolls back the transaction a reservation message began and returns the client (destroyed if that fails). */
export async function endTransaction(client: pg.PoolClient): Promise<void> {
  try {
    await client.query('ROLLBACK')
    client.release()
  } catch (error) {
    client.release(error as Error)
  }
}

// Pools found to reach Postgres through a pooler in transaction mode: their statements go unnamed from then on.
const pooled = new WeakSet<pg.Pool>()

/** Whether the store's statements are prepared once per connection (its option, unless a pooler was detected). */
export function preparesStatements(store: ResolvedStore): boolean {
  return store.preparedStatements && !pooled.has(store.pool)
}

/**
 * The query as sent: named (prepared once per connection by node-postgres) when the store prepares statements,
 * unnamed otherwise, for transaction-mode poolers where the next statement may reach another server connection.
 */
export function sendable(query: Query, store: ResolvedStore): Query {
  return query.name === undefined || preparesStatements(store)
    ? query
    : { text: query.text, values: query.values }
}

/**
 * Recognises what a pooler in transaction mode does to prepared statements: one prepared on a server connection is
 * missing on the next (SQLSTATE 26000), or already there when another client prepared it (42P05). Neither happens on
 * a connection of one's own. Once seen, the store's pool sends every statement unnamed, and the error that revealed
 * it is replaced by one that names the cause and the setting to make it the configuration.
 */
export function detectPooler(store: ResolvedStore, error: unknown): StoreSetupError | undefined {
  const code = (error as { code?: unknown } | undefined)?.code
  if ((code !== '26000' && code !== '42P05') || !preparesStatements(store)) return undefined
  pooled.add(store.pool)
  const message = error instanceof Error ? error.message : String(error)
  return new StoreSetupError(
    `The idempotency store prepares its statements once per connection, but Postgres answered "${message}": its connections go through a pooler in transaction mode (PgBouncer, RDS Proxy...), where a statement prepared on one server connection is unknown to the next. From now on this pool's statements are sent unnamed; set postgresStore({ pool, preparedStatements: false }) to make that the configuration.`,
    code,
    error,
  )
}
