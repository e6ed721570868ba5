import type pg from 'pg'
import { checkIdentifier, type TableNames, tableNames } from './identifiers.js'
import { DEFAULT_SCHEMA, DEFAULT_TABLE } from './migrations.js'

/** Options of {@link postgresStore}. */
export interface PostgresStoreOptions {
  /**
   * Your pool, on the database that holds your business tables too, so key records and business writes commit in
   * one transaction. The store adds an `'error'` listener to it (an idle client losing its connection must not
   * crash the process) and never ends it.
   */
  pool: pg.Pool
  /** @default 'oncely' */
  schema?: string
  /** @default 'idempotency_keys' */
  table?: string
  /**
   * Prepare the engine's statements once per connection and send the reservation with `BEGIN`, and the completion
   * with `COMMIT`, in one message each (two round trips fewer per new key, no planning per request). Set `false`
   * behind a pooler in transaction mode (PgBouncer, RDS Proxy...), where the next statement may reach another
   * server connection that never saw the `PREPARE`: every statement is then sent unnamed, with parameters.
   * @default true
   * @example
   * postgresStore({ pool: pgbouncerPool, preparedStatements: false })
   */
  preparedStatements?: boolean
}

/** Where the engine keeps key records. Create with {@link postgresStore}. */
export interface PostgresStore {
  /** The pool it was created with. */
  readonly pool: pg.Pool
  /** The schema of the key table. */
  readonly schema: string
  /** The key table. */
  readonly table: string
}

/** What the engine and the other layers use of a store; not part of the public API. */
export interface ResolvedStore {
  readonly pool: pg.Pool
  readonly names: TableNames
  readonly preparedStatements: boolean
}

const resolved = new WeakMap<PostgresStore, ResolvedStore>()

/** The store's internals, or a TypeError naming `option` when `store` was not made by {@link postgresStore}. */
export function resolveStore(store: unknown, option = 'store'): ResolvedStore {
  const found = typeof store === 'object' && store !== null ? resolved.get(store as PostgresStore) : undefined
  if (!found) throw new TypeError(`Expected \`${option}\` to be a postgresStore().`)
  return found
}

/**
 * The Postgres store: the table created by `migrate()` on your pool.
 *
 * @example
 * const store = postgresStore({ pool, schema: 'oncely', table: 'idempotency_keys' })
 */
export function postgresStore(options: PostgresStoreOptions): PostgresStore {
  if (typeof options !== 'object' || options === null)
    throw new TypeError('Expected `options` to be an object.')
  const { pool } = options
  if (typeof pool?.connect !== 'function' || typeof pool.query !== 'function') {
    throw new TypeError('Expected `pool` to be a pg.Pool.')
  }
  const schema = checkIdentifier('schema', options.schema ?? DEFAULT_SCHEMA)
  const table = checkIdentifier('table', options.table ?? DEFAULT_TABLE)
  const preparedStatements = options.preparedStatements ?? true
  if (typeof preparedStatements !== 'boolean')
    throw new TypeError('Expected `preparedStatements` to be a boolean.')
  guardPool(pool)
  const store: PostgresStore = Object.freeze({ pool, schema, table })
  resolved.set(store, { pool, names: tableNames(schema, table), preparedStatements })
  return store
}

const guarded = new WeakSet<object>()
const ignore = () => {}

/**
 * Makes sure no client of the pool can crash the process with an unhandled 'error' event. pg-pool leaves a window
 * with no listener at all: it hands a client to `pool.connect()` through a promise, so if the same socket read also
 * carries the server's FATAL "terminating connection" message, 'error' is emitted before the caller's continuation
 * can attach its listener (regression: connection-kill.test.ts). A permanent listener attached on 'acquire', which
 * pg-pool emits synchronously before handing the client out, closes it. The error still reaches whoever is using
 * the client through its failed query.
 */
function guardPool(pool: pg.Pool): void {
  if (guarded.has(pool)) return
  guarded.add(pool)
  if (pool.listenerCount('error') === 0) pool.on('error', ignore)
  pool.on('acquire', (client) => {
    if (guarded.has(client)) return
    guarded.add(client)
    client.on('error', ignore)
  })
}
