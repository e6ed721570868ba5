// The workload of the engine tools (engine-ab, engine-allocations): first executions of `engine.execute()` under
// `reservation: 'lock'`, without HTTP, 10 at a time, each handler inserting one row, on a build of @oncely/server
// loaded from its dist folder.
import path from 'node:path'
import { pathToFileURL } from 'node:url'
import type * as Server from '@oncely/server'
import pg from 'pg'

/** One build's engine on a pool of its own (each build keeps its own record of what it prepared on a connection). */
export interface BuildEngine {
  engine: Server.Engine
  pool: pg.Pool
}

/** Loads the build in `dist` and makes its engine, with its tables (and the ledger) in `schema`. */
export async function engineOfBuild(dist: string, databaseUrl: string, schema: string): Promise<BuildEngine> {
  const server = (await import(pathToFileURL(path.resolve(dist, 'index.js')).href)) as typeof Server
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 10 })
  pool.on('error', () => {})
  await server.migrate(pool, { schema })
  await pool.query(`CREATE TABLE IF NOT EXISTS ${schema}.ledger (id bigserial PRIMARY KEY, k text NOT NULL)`)
  return {
    engine: server.createEngine({ store: server.postgresStore({ pool, schema }), reservation: 'lock' }),
    pool,
  }
}

let sequence = 0

/** Runs `executions` first executions, 10 at a time; throws on any other outcome. */
export async function firstExecutions(
  engine: Server.Engine,
  schema: string,
  executions: number,
): Promise<void> {
  const input = (key: string): Server.ExecuteInput => ({
    scope: 'bench',
    operation: 'POST /ledger',
    key,
    fingerprint: 'f'.repeat(64),
    handler: async (ctx) => {
      await ctx.tx.query(`INSERT INTO ${schema}.ledger (k) VALUES ($1)`, [key])
      return { status: 201, headers: { 'content-type': 'application/json' }, body: { ok: true } }
    },
  })
  let next = 0
  await Promise.all(
    Array.from({ length: 10 }, async () => {
      while (next < executions) {
        next++
        const outcome = await engine.execute(input(`k-${process.pid}-${++sequence}`))
        if (outcome.kind !== 'executed') throw new Error(`expected a first execution, got ${outcome.kind}`)
      }
    }),
  )
}
