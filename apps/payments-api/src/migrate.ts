/**
 * The demo's own schema: numbered `.sql` files in `migrations/`, applied in order, each in its own transaction,
 * under a session advisory lock so several instances starting at once apply each file exactly once.
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
 * Applies the migrations that are not yet applied and returns the names of those it applied.
 *
 * @example
 * await migrateApp(pool) // ['payments', 'provider_charges', 'outbox'] on an empty database
 */
export async function migrateApp(pool: pg.Pool): Promise<string[]> {
  const migrations = await readMigrations()
  const client = await pool.connect()
  try {
    await client.query('SELECT pg_advisory_lock($1)', [LOCK_ID])
    try {
      await client.query(
        `CREATE TABLE IF NOT EXISTS payments_api_migrations (
           version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
      )
      const { rows } = await client.query<{ version: number }>('SELECT version FROM payments_api_migrations')
      const done = new Set(rows.map((row) => row.version))
      const applied: string[] = []
      for (const migration of migrations) {
        if (done.has(migration.version)) continue
        await client.query('BEGIN')
        try {
          await client.query(migration.sql)
          await client.query('INSERT INTO payments_api_migrations (version, name) VALUES ($1, $2)', [
            migration.version,
            migration.name,
          ])
          await client.query('COMMIT')
        } catch (error) {
          await client.query('ROLLBACK')
          throw error
        }
        applied.push(migration.name)
      }
      return applied
    } finally {
      await client.query('SELECT pg_advisory_unlock($1)', [LOCK_ID])
    }
  } finally {
    client.release()
  }
}
