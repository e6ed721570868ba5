import { migrate } from '@oncely/server'
import type pg from 'pg'
import { migrateApp } from './migrate.js'

/** Schema of oncely's idempotency table. */
export const ONCELY_SCHEMA = 'oncely'

/**
 * Brings the database up to date: oncely's idempotency table, then the demo's own tables. Both take an advisory
 * lock, so several instances may call this at once when they start.
 */
export async function prepareDatabase(pool: pg.Pool): Promise<{ applied: string[] }> {
  const oncely = await migrate(pool, { schema: ONCELY_SCHEMA })
  const app = await migrateApp(pool)
  return { applied: [...oncely.applied, ...app] }
}
