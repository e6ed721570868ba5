import type pg from 'pg'
import { nodePostgres } from '../datasources/node-postgres.js'
import { objectOptions, optionalBoolean } from '../options/check.js'
import { poolOrDatabase } from '../options/datasource.js'
import type { Database } from './database.js'
import { checkIdentifier, type TableNames, tableNames } from './identifiers.js'
import { DEFAULT_SCHEMA, DEFAULT_TABLE } from './migrations.js'

interface TableOptions {
  /** @default 'oncely' */
  schema?: string
  /** @default 'idempotency_keys' */
  table?: string
}

/** Options of {@link postgresStore} over a node-postgres pool. */
export interface PoolStoreOptions extends TableOptions {
  /**
   * Your pool, on the database that holds your business tables too, so key records and business writes commit in
   * one transaction. The store adds an `'error'` listener to it (an idle client losing its connection must not
   * crash the process) and never ends it. Handlers get a `pg.PoolClient` as `ctx.tx`.
   */
  pool: pg.Pool
  /**
   * Prepare the engine's statements once per connection and send the reservation with `BEGIN`, and the completion
   * with `COMMIT`, in one message each (no planning per request). Set `false` behind a pooler in transaction mode
   * (PgBouncer, RDS Proxy...), where the next statement may reach another server connection that never saw the
   * `PREPARE`: statements are then planned where they run (still one message each).
   * @default true
   * @example
   * postgresStore({ pool: pgbouncerPool, preparedStatements: false })
   */
  preparedStatements?: boolean
  database?: undefined
}

/** Options of {@link postgresStore} over any datasource. */
export interface DatabaseStoreOptions<Tx> extends TableOptions {
  /**
   * The datasource of your database library (`nodePostgres({ pool })`, or one of `@oncely/server/postgres-js`,
   * `/drizzle`, `/kysely`, `/knex`, `/prisma`, `/typeorm`, `/pglite`), on the database that holds your business
   * tables too. Handlers get that library's own transaction object as `ctx.tx`.
   */
  database: Database<Tx>
  pool?: undefined
  preparedStatements?: undefined
}

/** Options of {@link postgresStore}: a node-postgres `pool`, or the `database` of any datasource. */
export type PostgresStoreOptions<Tx = pg.PoolClient> = PoolStoreOptions | DatabaseStoreOptions<Tx>

/** Where the engine keeps key records. Create with {@link postgresStore}. */
export interface PostgresStore<Tx = pg.PoolClient> {
  /** The datasource its statements go through. */
  readonly database: Database<Tx>
  /** The schema of the key table. */
  readonly schema: string
  /** The key table. */
  readonly table: string
}

/** What the engine and the other layers use of a store; not part of the public API. */
export interface ResolvedStore<Tx = unknown> {
  readonly database: Database<Tx>
  readonly names: TableNames
}

const resolved = new WeakMap<PostgresStore<never>, ResolvedStore<never>>()

/** The store's internals, or a TypeError naming `option` when `store` was not made by {@link postgresStore}. */
export function resolveStore<Tx>(store: PostgresStore<Tx> | unknown, option = 'store'): ResolvedStore<Tx> {
  const found =
    typeof store === 'object' && store !== null ? resolved.get(store as PostgresStore<never>) : undefined
  if (!found) throw new TypeError(`Expected \`${option}\` to be a postgresStore().`)
  return found as ResolvedStore<Tx>
}

/**
 * The Postgres store: the table created by `migrate()`, reached through your pool or your library's datasource.
 *
 * @example
 * const store = postgresStore({ pool, schema: 'oncely', table: 'idempotency_keys' })
 * const drizzleStore = postgresStore({ database: drizzleDatabase({ db }) }) // from '@oncely/server/drizzle'
 */
export function postgresStore(options: PoolStoreOptions): PostgresStore<pg.PoolClient>
export function postgresStore<Tx>(options: DatabaseStoreOptions<Tx>): PostgresStore<Tx>
export function postgresStore<Tx>(options: PostgresStoreOptions<Tx>): PostgresStore<Tx | pg.PoolClient> {
  objectOptions('postgresStore()', options)
  const preparedStatements = optionalBoolean('preparedStatements', options.preparedStatements, true)
  const database: Database<Tx | pg.PoolClient> = poolOrDatabase<Tx | pg.PoolClient>(
    'postgresStore()',
    options,
    (pool) => nodePostgres({ pool, preparedStatements }),
  )
  const schema = checkIdentifier('schema', options.schema ?? DEFAULT_SCHEMA)
  const table = checkIdentifier('table', options.table ?? DEFAULT_TABLE)
  const store: PostgresStore<Tx | pg.PoolClient> = Object.freeze({ database, schema, table })
  resolved.set(
    store as PostgresStore<never>,
    { database, names: tableNames(schema, table) } as ResolvedStore<never>,
  )
  return store
}
