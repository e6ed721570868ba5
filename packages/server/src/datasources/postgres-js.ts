// The postgres.js datasource: the seam over a `postgres()` instance (v3), through callback-database.ts. The handler's
// transaction is the `TransactionSql` of `sql.begin(async (tx) => ...)`.
import type { Sql, TransactionSql } from 'postgres'
import { objectOptions } from '../options/check.js'
import type { Database, Rows, Statement } from '../store/database.js'
import { callbackDatabase } from './callback-database.js'

/** Options of {@link postgresJs}. */
export interface PostgresJsOptions {
  /**
   * Your `postgres()` instance, on the database that holds your business tables too. It must have no `transform`
   * (such as `postgres.camel`): oncely reads the columns it names. oncely never ends it.
   */
  sql: Sql
  /**
   * A second instance, of at most a few connections, for the statements that must commit while every connection of
   * `sql` is held by an attempt (a recovery point, a renewed lease). You end it.
   * @default an instance with the settings of `sql` and `max: 2`, whose idle connections close after a second
   * @example
   * postgresJs({ sql, side: postgres(url, { max: 2 }) })
   */
  side?: Sql
}

/** How long an idle connection of the default side instance is kept, in seconds (it keeps the process alive). */
const SIDE_IDLE_SECONDS = 1
const SIDE_CONNECTIONS = 2

const databases = new WeakMap<Sql, Database<TransactionSql>>()

/**
 * The postgres.js datasource: `ctx.tx` is the `TransactionSql` of the attempt's transaction. One per instance
 * (calling it again with the same `sql` returns the same object).
 *
 * @example
 * import postgres from 'postgres'
 * import { postgresJs } from '@oncely/server/postgres-js'
 *
 * const sql = postgres(process.env.DATABASE_URL)
 * const engine = createEngine({ store: postgresStore({ database: postgresJs({ sql }) }) })
 * // in a handler: await ctx.tx`INSERT INTO payments (cart) VALUES (${cart})`
 */
export function postgresJs(options: PostgresJsOptions): Database<TransactionSql> {
  objectOptions('postgresJs()', options)
  const { sql, side } = options
  if (!isSql(sql)) throw new TypeError('Expected `sql` to be a postgres.js instance (`postgres(url)`).')
  if (side !== undefined && !isSql(side))
    throw new TypeError('Expected `side` to be a postgres.js instance (`postgres(url, { max: 2 })`).')
  for (const each of [sql, side]) {
    const transform = each?.options.transform
    if (transform && [transform.column, transform.value, transform.row].some((t) => t?.from !== undefined))
      throw new TypeError(
        `Expected \`${each === sql ? 'sql' : 'side'}\` to have no \`transform\` (such as postgres.camel): oncely reads the columns it names. Give oncely an instance without one on the same database.`,
      )
  }
  let database = databases.get(sql)
  if (database && side === undefined) return database
  let lane = side
  // Imported when first used, so that the Drizzle datasource over node-postgres never loads postgres.js.
  const sideSql = async () => {
    if (!lane) {
      const { default: postgres } = await import('postgres')
      lane ??= postgres({ ...sql.options, max: SIDE_CONNECTIONS, idle_timeout: SIDE_IDLE_SECONDS } as never)
    }
    return lane
  }
  database = callbackDatabase<TransactionSql>({
    library: 'postgres.js',
    source: sql,
    transaction: (work) => sql.begin((tx) => work(tx)) as Promise<never>,
    execute: (tx, statement) => runOn(tx, sql, statement),
    query: (statement) => runOn(sql, sql, statement),
    side: async (statement) => {
      const on = await sideSql()
      return runOn(on, on, statement)
    },
    savepoint: (tx, work) => tx.savepoint((inner) => work(inner)) as Promise<never>,
    // postgres.js writes the queries of a transaction together and reads their answers in order.
    pipelines: true,
    isTransaction: (tx): tx is TransactionSql =>
      typeof tx === 'function' &&
      typeof (tx as TransactionSql).savepoint === 'function' &&
      typeof (tx as TransactionSql).unsafe === 'function',
  })
  if (side === undefined) databases.set(sql, database)
  return database
}

const isSql = (sql: unknown): sql is Sql =>
  typeof sql === 'function' &&
  typeof (sql as Sql).unsafe === 'function' &&
  typeof (sql as Sql).begin === 'function' &&
  typeof (sql as Sql).options === 'object'

/**
 * Runs a statement through postgres.js, on `on` (the instance `root` or one of its transactions). The engine's statements (those with a name) are prepared once per
 * connection when the instance prepares (`prepare: true`, its default). postgres.js errors keep Postgres's SQLSTATE
 * as `code`.
 */
export async function runOn(on: Sql | TransactionSql, root: Sql, statement: Statement): Promise<Rows> {
  const { text, values } = asSent(statement, root.options.serializers as never)
  const result = await on.unsafe(text, values as never[], { prepare: statement.name !== undefined })
  // A message of several statements (a migration) answers one result per statement.
  const tail = result[result.length - 1]
  const last = (Array.isArray(tail) ? tail : result) as unknown as Record<string, unknown>[] & {
    count: number | null
  }
  return { rows: [...last], rowCount: last.count ?? 0 }
}

const JSON_TYPES = new Set(['json', 'jsonb'])
const TIME_TYPES = new Set(['timestamptz', 'timestamp', 'date'])
const CAST = /\$(\d+)::(\w+)/g
const PLACEHOLDER = /\$(\d+)(?!\d)/g
const SAMPLE_TIME = '2000-01-01 00:00:00.000001+00'

/**
 * A timestamp given as Postgres's own text, kept to the microsecond: postgres.js serializes a timestamp parameter
 * with `toISOString()`, which for a string would go through a `Date` (milliseconds) first.
 */
class ExactTimestamp extends Date {
  readonly #text: string
  constructor(text: string) {
    super(Number.NaN)
    this.#text = text
  }
  override toISOString(): string {
    return this.#text
  }
}

/** How an instance's serializers treat text (Drizzle replaces postgres.js's own with ones that pass it through). */
function serializing(serializers: Record<number, ((value: unknown) => unknown) | undefined>) {
  return {
    /** Whether a JSON text given for a json parameter would be encoded once more, as a JSON string. */
    reencodesJson: serializers[3802]?.('{}') !== '{}',
    /** Whether a timestamp text would go through a `Date` (and lose its microseconds). */
    parsesTime: serializers[1184]?.(SAMPLE_TIME) !== SAMPLE_TIME,
  }
}

const isPlainObject = (value: unknown) =>
  typeof value === 'object' &&
  value !== null &&
  !Array.isArray(value) &&
  !(value instanceof Date) &&
  !(value instanceof Uint8Array)

/**
 * The statement as a postgres.js instance must be given it so that every value reaches Postgres as node-postgres
 * would send it. postgres.js serializes a parameter by the type Postgres describes for it: by default a JSON text
 * for a `jsonb` parameter would be encoded once more as a JSON string (it is sent as text and cast by Postgres
 * instead) and a timestamp text would lose its microseconds; under Drizzle's serializers, which pass values
 * through, an object would not be encoded at all (it is sent as its JSON text). The types are the statement's own,
 * or the casts on its placeholders.
 */
export function asSent(
  statement: Statement,
  serializers: Record<number, ((value: unknown) => unknown) | undefined>,
): { text: string; values: readonly unknown[] } {
  const { values } = statement
  if (values.length === 0) return statement
  const { reencodesJson, parsesTime } = serializing(serializers)
  const declared: (string | undefined)[] = [...(statement.types ?? [])]
  for (const [, n, type] of statement.text.matchAll(CAST)) declared[Number(n) - 1] ??= type
  const isText = (n: number, types: Set<string>) =>
    typeof values[n - 1] === 'string' && types.has(declared[n - 1] ?? '')
  const text = reencodesJson
    ? statement.text.replace(PLACEHOLDER, (whole, n: string) =>
        isText(Number(n), JSON_TYPES) ? `($${n}::text::${declared[Number(n) - 1]})` : whole,
      )
    : statement.text
  return {
    text,
    values: values.map((value, i) =>
      parsesTime && isText(i + 1, TIME_TYPES)
        ? new ExactTimestamp(value as string)
        : !reencodesJson && isPlainObject(value)
          ? JSON.stringify(value)
          : value,
    ),
  }
}
