// Scale: how the engine behaves with a large key table (bulk-filled with generate_series), how fast the reaper
// deletes expired keys, and how long the client's resume() takes with many pending intents.
import { randomUUID } from 'node:crypto'
import { mkdtemp, rm } from 'node:fs/promises'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { performance } from 'node:perf_hooks'
import { createClient, type IntentStore, memoryStore } from '@oncely/client'
import { fileStore } from '@oncely/client/node'
import { createEngine, migrate, postgresStore } from '@oncely/server'
import type pg from 'pg'
import { ledgerIntent } from '../intent.js'
import { ONCELY_SCHEMA } from '../server/oncely.js'

const TABLE = `${ONCELY_SCHEMA}.idempotency_keys`
const FILL_CHUNK = 1_000_000

/** Rows currently in oncely's key table. */
export async function keyRows(pool: pg.Pool): Promise<number> {
  const { rows } = await pool.query<{ n: string }>(`SELECT count(*) AS n FROM ${TABLE}`)
  return Number(rows[0]!.n)
}

/**
 * Adds finished (or, with `expired`, already expired) keys until the table holds `target` rows, in chunks so one
 * statement never holds millions of rows of WAL, then refreshes the planner's statistics. With `likeExisting`, each
 * added row copies a finished row already in the table (one an application wrote: its headers, body and recovery
 * point) under a new key, so sizes and delete costs are those of that application's rows rather than the filler's.
 */
export async function fillKeys(
  pool: pg.Pool,
  target: number,
  options: { expired?: boolean; likeExisting?: boolean } = {},
): Promise<number> {
  await migrate(pool, { schema: ONCELY_SCHEMA })
  const start = await keyRows(pool)
  const expiry = options.expired ? "now() - interval '1 second'" : "now() + interval '1 day'"
  const tag = randomUUID().slice(0, 8)
  const rows = options.likeExisting
    ? `SELECT t.scope, t.operation, $1 || '-' || i, t.fingerprint, t.status, t.request_headers, t.response_status,
  t.response_headers, t.response_body, t.recovery_point, ${expiry}
FROM generate_series($2::bigint, $3::bigint) AS i,
  (SELECT * FROM ${TABLE} WHERE status = 'succeeded' ORDER BY created_at DESC LIMIT 1) AS t`
    : `SELECT 'filler', 'POST /ledger', $1 || '-' || i, md5(i::text) || md5(i::text), 'succeeded', NULL, 201,
  '{"content-type":"application/json"}', convert_to('{"id":"1","account":"acct-42","amount":1250}', 'UTF8'), NULL,
  ${expiry}
FROM generate_series($2::bigint, $3::bigint) AS i`
  for (let from = start; from < target; from += FILL_CHUNK) {
    const to = Math.min(target, from + FILL_CHUNK)
    const { rowCount } = await pool.query(
      `INSERT INTO ${TABLE} (scope, operation, key, fingerprint, status, request_headers, response_status,
  response_headers, response_body, recovery_point, expires_at)
${rows}`,
      [tag, from + 1, to],
    )
    if (options.likeExisting && rowCount === 0) throw new Error('fillKeys: no finished key to copy')
  }
  await pool.query(`VACUUM ANALYZE ${TABLE}`)
  // Flush the fill's dirty pages now, so a checkpoint spread over the next minutes does not compete with the
  // measured commits for the disk (a 9M-row fill writes gigabytes of WAL). Needs superuser or pg_checkpoint.
  await pool.query('CHECKPOINT').catch(() => {})
  return target - start
}

export interface ReaperResult {
  expiredRows: number
  batchSize: number
  seconds: number
  rowsPerSecond: number
}

/**
 * Fills `expiredRows` expired keys (copies of a finished row already there with `likeExisting`, see
 * {@link fillKeys}), then times `engine.reap()` until nothing is left to delete.
 */
export async function reaperThroughput(
  pool: pg.Pool,
  expiredRows: number,
  options: { batchSize?: number; likeExisting?: boolean } = {},
): Promise<ReaperResult> {
  const batchSize = options.batchSize ?? 1_000
  // The table may not exist yet (a suite run on its own): count its rows only once it does.
  await migrate(pool, { schema: ONCELY_SCHEMA })
  const before = await keyRows(pool)
  await fillKeys(pool, before + expiredRows, { expired: true, likeExisting: options.likeExisting ?? false })
  const engine = createEngine({ store: postgresStore({ pool, schema: ONCELY_SCHEMA }) })
  const started = performance.now()
  let deleted = 0
  for (;;) {
    const n = await engine.reap({ batchSize, maxBatches: 100 })
    deleted += n
    if (n === 0) break
  }
  const seconds = (performance.now() - started) / 1000
  return { expiredRows: deleted, batchSize, seconds, rowsPerSecond: deleted / seconds }
}

export interface ResumeResult {
  store: 'memoryStore' | 'fileStore' | 'indexedDbStore'
  intents: number
  seconds: number
  settled: number
}

/** Writes `intents` pending intents straight into each Node store, then times one `client.resume()`. */
export async function resumeTime(intents: number): Promise<ResumeResult[]> {
  const server = createServer((request, response) => {
    request.resume()
    request.on('end', () => {
      response.writeHead(201, { 'content-type': 'application/json' })
      response.end('{"ok":true}')
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  const dir = await mkdtemp(path.join(os.tmpdir(), 'oncely-bench-resume-'))
  const results: ResumeResult[] = []
  try {
    const stores: Array<[ResumeResult['store'], IntentStore]> = [
      ['memoryStore', memoryStore()],
      ['fileStore', fileStore({ dir })],
    ]
    for (const [name, store] of stores) {
      for (let i = 0; i < intents; i++) await store.set(ledgerIntent(url, 0))
      const client = createClient({ baseUrl: url, store, resumeOnStart: false, resumeOnOnline: false })
      const started = performance.now()
      const outcomes = await client.resume()
      const seconds = (performance.now() - started) / 1000
      await client.close()
      results.push({
        store: name,
        intents,
        seconds,
        settled: outcomes.filter((o) => o.outcome === 'settled').length,
      })
    }
  } finally {
    server.close()
    await rm(dir, { recursive: true, force: true })
  }
  return results
}
