/**
 * The demo's own schema: numbered `.sql` files in `migrations/`, applied in order, in one transaction under an
 * advisory lock so several instances starting at once apply each file exactly once.
 */
import { readdir, readFile } from 'node:fs/promises'
import type pg from 'pg'

const MIGRATIONS_DIR = new URL('../migrations/', import.meta.url)
// Any constant works; it only has to differ from other advisory locks taken on the same database.
const LOCK_ID = 0x0ce1_da40

/** A migration file: `001_payments.sql` has version 1 and name `payments`. */
interface Migration {
  version: number
  name: string
  sql: string
}

async function readMigrations(): Promise<Migration[]> {
  const files = (await readdir(MIGRATIONS_DIR)).filter((file) => /^\d+_[a-z0-9_]+\.sql$/.test(file)).sort()
  return Promise.all(
    files.map(async (file) => {
      const [, version, name] = /^(\d+)_(.+)\.sql$/.exec(file)!
      return {
        version: Number(version),
        name: name!,
        sql: await readFile(new URL(file, MIGRATIONS_DIR), 'utf8'),
      }
    }),
  )
}

/**
 * Applies the migrations that are not yet applied and returns the names of those it applied: all in one transaction,
 * under a transaction-scoped advisory lock. A session lock would not do behind a pooler in transaction mode, where
 * the lock and its unlock may reach two server connections and the lock outlives the migration on the first.
 *
 * @example
 * await migrateApp(pool) // ['payments', 'provider_charges', 'outbox'] on an empty database
 */
export async function migrateApp(pool: pg.Pool): Promise<string[]> {
  const migrations = await readMigrations()
  const client = await pool.connect()
  try {
    await client.query('BEGIN')
    await client.query('SELECT pg_advisory_xact_lock($1)', [LOCK_ID])
    await client.query(
      `CREATE TABLE IF NOT EXISTS payments_api_migrations (
         version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
    )
    const { rows } = await client.query<{ version: number }>('SELECT version FROM payments_api_migrations')
    const done = new Set(rows.map((row) => row.version))
    const applied: string[] = []
    for (const migration of migrations) {
      if (done.has(migration.version)) continue
      await client.query(migration.sql)
      await client.query('INSERT INTO payments_api_migrations (version, name) VALUES ($1, $2)', [
        migration.version,
        migration.name,
      ])
      applied.push(migration.name)
    }
    await client.query('COMMIT')
    client.release()
    return applied
  } catch (error) {
    // A connection that failed mid-migration is not handed back to the pool.
    await client.query('ROLLBACK').catch(() => {})
    client.release(error as Error)
    throw error
  }
}
