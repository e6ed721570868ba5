// What both reservation protocols do with a pooled connection: prepare a statement once, send a query with or
// without a name, and end a transaction that turned out not to be needed.
import type pg from 'pg'
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

/**
 * The query as sent: named (prepared once per connection by node-postgres) when the store prepares statements,
 * unnamed otherwise, for transaction-mode poolers where the next statement may reach another server connection.
 */
export function sendable(query: Query, preparedStatements: boolean): Query {
  return preparedStatements || query.name === undefined ? query : { text: query.text, values: query.values }
}
