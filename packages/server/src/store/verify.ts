import { StoreSetupError } from '../errors.js'
import type { ResolvedStore } from './postgres-store.js'

/** SQLSTATEs that mean "the migrations did not run here", as opposed to a connection or permission problem. */
const SETUP_ERRORS = new Set(['42P01', '3F000', '42703'])

/** The columns the engine reads and writes; a table missing one is older than this version. */
const COLUMNS = [
  'scope',
  'operation',
  'key',
  'fingerprint',
  'status',
  'lock_token',
  'locked_until',
  'request_headers',
  'response_status',
  'response_headers',
  'response_body',
  'recovery_point',
  'attempts',
  'created_at',
  'updated_at',
  'expires_at',
]

/** True when `error` is Postgres saying the store's table, schema or a column is missing. */
export function isSetupError(error: unknown): boolean {
  const code = (error as { code?: unknown } | undefined)?.code
  return typeof code === 'string' && SETUP_ERRORS.has(code)
}

/** The fix to tell a user whose store is not set up. */
export function setupAdvice(store: ResolvedStore): string {
  const { schema, table } = store.names
  const target =
    schema === 'oncely' && table === 'idempotency_keys'
      ? ''
      : `{ schema: ${JSON.stringify(schema)}, table: ${JSON.stringify(table)} }`
  return `Run \`await migrate(pool${target && `, ${target}`})\` from '@oncely/server' at start-up, or apply renderMigrations(${target}) with your migration tool.`
}

/**
 * Checks that the store's table exists with every column the engine uses. Resolves when it does; rejects with a
 * {@link StoreSetupError} naming the table and the fix when it does not, and with the database's error otherwise
 * (a connection failure is not a setup problem).
 */
export async function verifyStore(store: ResolvedStore): Promise<void> {
  const { qualified } = store.names
  try {
    await store.database.query({ text: `SELECT ${COLUMNS.join(', ')} FROM ${qualified} LIMIT 0`, values: [] })
  } catch (error) {
    if (!isSetupError(error)) throw error
    const code = (error as { code: string }).code
    const what =
      code === '42703'
        ? `The idempotency table ${qualified} is older than this version of @oncely/server (${(error as Error).message}).`
        : `The idempotency table ${qualified} does not exist.`
    throw new StoreSetupError(`${what} ${setupAdvice(store)}`, code, error)
  }
}
