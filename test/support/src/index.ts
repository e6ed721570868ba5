/**
 * Test helpers shared by the workspace. Postgres is never mocked: each test file gets a fresh database on the real
 * server named by DATABASE_URL (the test command starts an embedded one when it is unset).
 */
import { randomBytes } from 'node:crypto'
import pg from 'pg'

export interface TestDatabase {
  /** Connection string of the fresh database. */
  url: string
  /** Its name. */
  name: string
  /** A pool on it, with an 'error' listener so a restart cannot crash the test process. */
  pool: pg.Pool
  /** Closes the pool and drops the database. */
  drop(): Promise<void>
}

/** The server to create test databases on. Throws with a clear message when the test command was bypassed. */
export function adminUrl(): string {
  const url = process.env.DATABASE_URL
  if (!url) {
    throw new Error(
      'DATABASE_URL is not set. Run tests through `pnpm test` (it starts an embedded Postgres), or set DATABASE_URL.',
    )
  }
  return url
}

/** Returns `url` with its database name replaced. */
export function withDatabase(url: string, database: string): string {
  const parsed = new URL(url)
  parsed.pathname = `/${database}`
  return parsed.toString()
}

/**
 * Creates a fresh, empty database for one test file, so files can run in parallel without sharing tables.
 *
 * @example
 * let db: TestDatabase
 * beforeAll(async () => { db = await createTestDatabase('engine') })
 * afterAll(() => db.drop())
 */
export async function createTestDatabase(
  label = 'test',
  poolOptions: pg.PoolConfig = {},
): Promise<TestDatabase> {
  const name = `oncely_${label.replace(/[^a-z0-9_]/gi, '_').toLowerCase()}_${randomBytes(4).toString('hex')}`
  const admin = new pg.Client({ connectionString: adminUrl() })
  admin.on('error', () => {})
  await admin.connect()
  try {
    await admin.query(`CREATE DATABASE "${name}" TEMPLATE template0`)
  } finally {
    await admin.end()
  }
  const url = withDatabase(adminUrl(), name)
  const pool = new pg.Pool({ connectionString: url, max: 10, ...poolOptions })
  pool.on('error', () => {})
  let dropped = false
  return {
    url,
    name,
    pool,
    async drop() {
      if (dropped) return
      dropped = true
      await pool.end().catch(() => {})
      const client = new pg.Client({ connectionString: adminUrl() })
      client.on('error', () => {})
      await client.connect()
      try {
        await client.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`)
      } finally {
        await client.end()
      }
    },
  }
}

export { CHROMIUM_ARGS, chromiumLaunchOptions, chromiumPath, requireChromium } from './chromium.js'
export {
  type CitusCluster,
  type CitusNode,
  type CitusTestDatabase,
  citusBindir,
  citusMissing,
  createCitusTestDatabase,
  requireCitus,
  startCitusCluster,
} from './citus.js'
export { type PgBouncer, type PgBouncerOptions, pgbouncerPath, startPgBouncer } from './pgbouncer.js'
export {
  type FloodOutcome,
  jsonBodyOf,
  parseRawResponse,
  type RawOutcome,
  type RawPost,
  type RawResponse,
  rawFlood,
  rawPost,
  tally,
} from './raw-http.js'
export { accepts, freePort, optionalService, pullNext, waitFor } from './services.js'
export { spawnTsx } from './tsx.js'
export { type CountingProxy, countingProxy, countStatements, type WireCounts } from './wire.js'
