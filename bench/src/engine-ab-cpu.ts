// Two builds of @oncely/server against each other: Node CPU per first execution of `engine.execute()` under
// `reservation: 'lock'`, without HTTP, 10 concurrent executions whose handler inserts one row, rounds alternating
// between the builds (and which goes first) in one process, CPU from process.cpuUsage(). A change to the engine or
// a datasource is judged by the median of the per-round ratios, which a busy machine moves far less than either
// side's absolute figure. Each build gets a pool of its own (each keeps its own record of what it prepared on a
// connection).
//
//   cp -r packages/server/dist packages/server/dist-before     # the build to compare against, next to dist
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test pnpm --filter @oncely/bench engine-ab -- \
//     ../packages/server/dist-before ../packages/server/dist [--executions 3000] [--rounds 9]
import path from 'node:path'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import type * as Server from '@oncely/server'
import pg from 'pg'
import { median } from './stats.js'

const { values, positionals } = parseArgs({
  args: process.argv.slice(2).filter((arg) => arg !== '--'),
  allowPositionals: true,
  options: { executions: { type: 'string', default: '3000' }, rounds: { type: 'string', default: '9' } },
})
const [before, after] = positionals
if (!before || !after)
  throw new Error('usage: engine-ab <dist of the build before> <dist of the build after>')
const executions = Number(values.executions)
const rounds = Number(values.rounds)
const databaseUrl = process.env.DATABASE_URL
if (!databaseUrl) throw new Error('DATABASE_URL is required')

const load = async (dir: string) =>
  (await import(pathToFileURL(path.resolve(dir, 'index.js')).href)) as typeof Server
const schema = `engine_ab_${process.pid}`
const pools: pg.Pool[] = []
async function engineOf(dir: string): Promise<Server.Engine> {
  const server = await load(dir)
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 10 })
  pool.on('error', () => {})
  pools.push(pool)
  await server.migrate(pool, { schema })
  return server.createEngine({ store: server.postgresStore({ pool, schema }), reservation: 'lock' })
}
const sides = { before: await engineOf(before), after: await engineOf(after) }
await pools[0]?.query(
  `CREATE TABLE IF NOT EXISTS ${schema}.ledger (id bigserial PRIMARY KEY, k text NOT NULL)`,
)

let sequence = 0
/** Node CPU per first execution, in microseconds. */
async function cpuPerExecution(engine: Server.Engine): Promise<number> {
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
  const start = process.cpuUsage()
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
  const used = process.cpuUsage(start)
  return (used.user + used.system) / executions
}

const measured = { before: [] as number[], after: [] as number[] }
// Round 0 warms both builds up and is not counted.
for (let round = 0; round <= rounds; round++) {
  for (const side of round % 2 ? (['after', 'before'] as const) : (['before', 'after'] as const)) {
    const cpu = await cpuPerExecution(sides[side])
    if (round > 0) measured[side].push(cpu)
  }
}
const ratios = measured.after.map((cpu, i) => cpu / (measured.before[i] ?? Number.NaN))
const fixed = (xs: number[], digits: number) => xs.map((x) => x.toFixed(digits)).join(' ')
console.log(
  `before: ${median(measured.before).toFixed(1)} us per execution (rounds ${fixed(measured.before, 0)})`,
)
console.log(
  `after:  ${median(measured.after).toFixed(1)} us per execution (rounds ${fixed(measured.after, 0)})`,
)
console.log(`after / before: ${median(ratios).toFixed(3)} median (rounds ${fixed(ratios, 2)})`)
await pools[0]?.query(`DROP SCHEMA ${schema} CASCADE`)
await Promise.all(pools.map((pool) => pool.end()))
