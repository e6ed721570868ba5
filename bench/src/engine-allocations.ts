// Where one build of @oncely/server allocates per first execution of `engine.execute()` (the workload of
// engine-workload.ts), by function, from V8's sampling heap profiler with the objects garbage collection already
// freed counted too: what the garbage collector will have to clear. Bytes are sampled (one sample every
// `--interval` bytes on average), so they are estimates, but unlike CPU time they do not move with the machine's
// load: a change that allocates less shows here on a busy machine.
//
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test pnpm --filter @oncely/bench engine-allocations -- \
//     ../packages/server/dist [--executions 5000] [--top 30] [--interval 128]
import { parseArgs } from 'node:util'
import { allocationsOf, largestSites } from './allocations.js'
import { engineOfBuild, firstExecutions } from './engine-workload.js'

const { values, positionals } = parseArgs({
  args: process.argv.slice(2).filter((arg) => arg !== '--'),
  allowPositionals: true,
  options: {
    executions: { type: 'string', default: '5000' },
    top: { type: 'string', default: '30' },
    interval: { type: 'string', default: '128' },
  },
})
const [dist] = positionals
if (!dist) throw new Error('usage: engine-allocations <dist of the build>')
const executions = Number(values.executions)
const databaseUrl = process.env.DATABASE_URL
if (!databaseUrl) throw new Error('DATABASE_URL is required')

const schema = `engine_allocations_${process.pid}`
const { engine, pool } = await engineOfBuild(dist, databaseUrl, schema)
await firstExecutions(engine, schema, 2_000) // warm-up: prepared statements, optimised code
const { total, sites } = await allocationsOf(
  () => firstExecutions(engine, schema, executions),
  executions,
  Number(values.interval),
)
console.log(`${dist}: about ${Math.round(total)} bytes allocated per first execution`)
for (const line of largestSites(sites, Number(values.top))) console.log(line)
await pool.query(`DROP SCHEMA ${schema} CASCADE`)
await pool.end()
