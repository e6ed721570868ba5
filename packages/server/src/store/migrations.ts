import type pg from 'pg'
import { objectOptions } from '../options/check.js'
import { asDatabase } from './as-database.js'
import type { Database } from './database.js'
import { checkIdentifier, constraintName, quoteIdent } from './identifiers.js'
import { MIGRATION_TEMPLATES } from './migration-sql.js'

/** One numbered migration, ready to run. */
export interface Migration {
  /** Position in the sequence, starting at 1. Never reused. */
  id: number
  /** The file name without `.sql`, such as `001_create_idempotency_keys`. */
  name: string
  /**
   * `'table'`: the migration changes the key table, and runs once per key table. `'schema'`: it changes what the
   * key tables of a schema share (the outbox), and runs once per schema, whichever key table migrates first.
   */
  appliesTo: 'table' | 'schema'
  /** The SQL with the schema and table names filled in. */
  sql: string
}

/** Where the idempotency table lives. */
export interface MigrationTarget {
  /** @default 'oncely' */
  schema?: string
  /** @default 'idempotency_keys' */
  table?: string
}

/** The default schema of the idempotency table. */
export const DEFAULT_SCHEMA = 'oncely'
/** The default name of the idempotency table. */
export const DEFAULT_TABLE = 'idempotency_keys'
const LEDGER = 'oncely_migrations'
/** The ledger's `table_name` of a migration that runs once per schema (no table is named ''). */
const SCHEMA_WIDE = ''

/**
 * The migrations rendered for a schema and table, for users who apply SQL with their own migration tool.
 *
 * @example
 * for (const m of renderMigrations({ schema: 'billing' })) await myTool.apply(m.name, m.sql)
 */
export function renderMigrations(target: MigrationTarget = {}): Migration[] {
  const schema = checkIdentifier('schema', target.schema ?? DEFAULT_SCHEMA)
  const table = checkIdentifier('table', target.table ?? DEFAULT_TABLE)
  const names: Record<string, string> = {
    schema: quoteIdent(schema),
    table: quoteIdent(table),
    expires_index: quoteIdent(`${table}_expires_at_idx`.slice(0, 63)),
    key_check: quoteIdent(constraintName(table, 'key', 'check')),
    status_check: quoteIdent(constraintName(table, 'status', 'check')),
  }
  return MIGRATION_TEMPLATES.map((m) => ({
    id: m.id,
    name: m.name,
    appliesTo: m.appliesTo,
    sql: m.sql.replace(/\{\{(\w+)\}\}/g, (_, name: string) => names[name] ?? `{{${name}}}`),
  }))
}

/** The migrations for the default `oncely.idempotency_keys` table. Use {@link renderMigrations} for other names. */
export const migrations: readonly Migration[] = renderMigrations()

/** What {@link migrate} did. */
export interface MigrateResult {
  /** Names of the migrations applied by this call, in order (empty when the schema was up to date). */
  applied: string[]
}

/**
 * Creates the schema and applies pending migrations in one transaction, under a transaction-scoped advisory lock,
 * so any number of instances can call it at start-up at once: one applies, the others wait and find nothing to do.
 * Applied migrations are recorded in `<schema>.oncely_migrations`: per key table, or once for the schema (`appliesTo`).
 * Takes your node-postgres pool, or the datasource of another library.
 *
 * @example
 * await migrate(pool, { schema: 'oncely' })
 * await migrate(kyselyDatabase({ db }))
 */
export async function migrate(on: pg.Pool | Database, target: MigrationTarget = {}): Promise<MigrateResult> {
  const database = asDatabase(on, 'migrate()')
  objectOptions('migrate()', target)
  const list = renderMigrations(target)
  const schema = quoteIdent(target.schema ?? DEFAULT_SCHEMA)
  const table = target.table ?? DEFAULT_TABLE
  const ledger = `${schema}.${quoteIdent(LEDGER)}`
  return database.transaction(async (tx) => {
    const run = (text: string, values: unknown[] = []) => database.execute(tx, { text, values })
    // Cast: a void column is one some libraries cannot read (Prisma).
    await run('SELECT pg_advisory_xact_lock(hashtextextended($1, 0))::text', [`oncely:migrate:${schema}`])
    await run(`CREATE SCHEMA IF NOT EXISTS ${schema}`)
    await run(
      `CREATE TABLE IF NOT EXISTS ${ledger} (
        table_name text NOT NULL, id integer NOT NULL, name text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (table_name, id))`,
    )
    const done = await run(`SELECT table_name, id FROM ${ledger}`)
    // A schema-wide migration recorded under any table ran in this schema: versions before `appliesTo` recorded it
    // once per key table, and ran it again for each.
    const ranHere = new Set<number>()
    const ranInSchema = new Set<number>()
    for (const row of done.rows) {
      if (row.table_name === table) ranHere.add(row.id as number)
      ranInSchema.add(row.id as number)
    }
    const applied: string[] = []
    for (const migration of list) {
      if ((migration.appliesTo === 'schema' ? ranInSchema : ranHere).has(migration.id)) continue
      for (const statement of splitStatements(migration.sql)) await run(statement)
      await run(`INSERT INTO ${ledger} (table_name, id, name) VALUES ($1, $2, $3)`, [
        migration.appliesTo === 'schema' ? SCHEMA_WIDE : table,
        migration.id,
        migration.name,
      ])
      applied.push(migration.name)
    }
    return { applied }
  })
}

/**
 * A migration's statements one by one: libraries that send statements with parameters (the extended protocol)
 * take one statement per call. The migrations' SQL has no semicolon inside a string, comment or body.
 */
function splitStatements(sql: string): string[] {
  return sql
    .split(/;\s*(?:\n|$)/)
    .map((part) => part.replace(/^\s*(--[^\n]*\n\s*)*/g, '').trim())
    .filter((part) => part !== '')
}
