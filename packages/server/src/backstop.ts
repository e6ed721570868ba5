import type pg from 'pg'
import { objectOptions, requiredFunction } from './options/check.js'
import type { Database } from './store/database.js'

/** What {@link insertOrExisting} found. */
export type BackstopResult<T> = { created: true; value: T } | { created: false; value: T }

/** Options of {@link insertOrExisting}. */
export interface BackstopOptions<T, Tx = pg.PoolClient> {
  /** The name of the business unique constraint (or unique index) that identifies the intent, such as `payments_cart_id_key`. */
  constraint: string
  /** The insert. Runs inside a savepoint so a unique violation does not abort the surrounding transaction. */
  insert: (tx: Tx) => Promise<T>
  /** Reads the row that already exists; called only after a unique violation on `constraint`. */
  existing: (tx: Tx) => Promise<T>
  /**
   * The datasource `tx` belongs to, when it is not a node-postgres client: the savepoint is then taken through that
   * library, in `tx`'s transaction.
   * @default none: `tx` is a pg client
   */
  database?: Database<Tx>
}

/** True when `error` is a unique violation (23505) of `constraint`, as any datasource or Citus reports it. */
export function isUniqueViolation(error: unknown, constraint: string): boolean {
  const e = error as {
    code?: unknown
    constraint?: unknown
    constraint_name?: unknown
    message?: unknown
  } | null
  if (e?.code !== '23505') return false
  // node-postgres names the constraint `constraint`, postgres.js `constraint_name`.
  const named = e.constraint ?? e.constraint_name
  if (named !== undefined) return named === constraint
  // Citus relays a worker's error without its constraint field; the message names the shard's copy of the
  // constraint, `<name>_<shard id>`, in double quotes.
  return (
    typeof e.message === 'string' &&
    e.message.includes(`"${constraint}_`) &&
    shardSuffixed(e.message, constraint)
  )
}

/** Whether `message` quotes `constraint` followed by `_` and a shard id: `"orders_cart_key_102040"`. */
function shardSuffixed(message: string, constraint: string): boolean {
  for (
    let at = message.indexOf(`"${constraint}_`);
    at !== -1;
    at = message.indexOf(`"${constraint}_`, at + 1)
  ) {
    if (/^\d+"/.test(message.slice(at + constraint.length + 2))) return true
  }
  return false
}

/**
 * The second line of defence: an idempotency key expires (after `retentionMs`) or is lost, a very late retry arrives
 * as a new request, and the business unique constraint catches it. This maps that unique violation (`23505` on the
 * named constraint, detected by code and constraint name, never by message) to the existing resource. Other errors,
 * including violations of other constraints, are rethrown. Must run inside a transaction (`ctx.tx` is one). On a
 * table distributed by Citus, whose relayed error has no constraint name, the name is read from the message, where
 * Citus gives it with the shard's id appended.
 *
 * @example
 * const { created, value: payment } = await insertOrExisting(ctx.tx, {
 *   constraint: 'payments_cart_id_key',
 *   insert: (tx) => tx.query('INSERT INTO payments (cart_id, amount) VALUES ($1, $2) RETURNING *', [cart, amount]).then((r) => r.rows[0]),
 *   existing: (tx) => tx.query('SELECT * FROM payments WHERE cart_id = $1', [cart]).then((r) => r.rows[0]),
 * })
 * return { status: created ? 201 : 200, body: payment }
 */
export async function insertOrExisting<T, Tx = pg.PoolClient>(
  tx: Tx,
  options: BackstopOptions<T, Tx>,
): Promise<BackstopResult<T>> {
  objectOptions('insertOrExisting()', options)
  if (typeof options.constraint !== 'string' || options.constraint === '') {
    throw new TypeError('Expected `constraint` to be the name of a unique constraint.')
  }
  requiredFunction('insert', options.insert)
  requiredFunction('existing', options.existing)
  const { database } = options
  if (database?.savepoint) {
    try {
      return { created: true, value: await database.savepoint(tx, (inner) => options.insert(inner)) }
    } catch (error) {
      if (!isUniqueViolation(error, options.constraint)) throw error
      return { created: false, value: await options.existing(tx) }
    }
  }
  const run = async (text: string) => {
    if (database) await database.execute(tx, { text, values: [] })
    else await (tx as pg.ClientBase).query(text)
  }
  await run('SAVEPOINT oncely_backstop')
  try {
    const value = await options.insert(tx)
    await run('RELEASE SAVEPOINT oncely_backstop')
    return { created: true, value }
  } catch (error) {
    await run('ROLLBACK TO SAVEPOINT oncely_backstop')
    // A library whose errors hide Postgres's (Prisma's P2002) has its datasource explain them.
    const seen = database?.diagnose?.(error)?.error ?? error
    if (!isUniqueViolation(seen, options.constraint)) throw error
    return { created: false, value: await options.existing(tx) }
  }
}
