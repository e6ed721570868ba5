// Where one build of @oncely/server allocates per first execution of `engine.execute()` (the workload of
// engine-workload.ts), by function, from V8's sampling heap profiler with the objects garbage collection already
// freed counted too: what the garbage collector will have to clear. Bytes are sampled (one sample every
// `--interval` bytes on average), so they are estimates, but unlike CPU time they do not move with the machine's
// load: a change that allocates less shows here on a busy machine.
//
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test pnpm --filter @oncely/bench engine-allocations -- \
//     ../packages/server/dist [--executions 5000] [--top 30] [--interval 128]
import { Session } from 'node:inspector/promises'
import { parseArgs } from 'node:util'
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

interface ProfileNode {
  callFrame: { functionName: string; url: string; lineNumber: number }
  selfSize: number
  children: ProfileNode[]
}

const schema = `engine_allocations_${process.pid}`
const { engine, pool } = await engineOfBuild(dist, databaseUrl, schema)
await firstExecutions(engine, schema, 2_000) // warm-up: prepared statements, optimised code
const session = new Session()
session.connect()
await session.post('HeapProfiler.startSampling', {
  samplingInterval: Number(values.interval),
  // Node 20's protocol types lack these two flags, which V8 takes: without them only what is still alive counts.
  ...{ includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true },
})
await firstExecutions(engine, schema, executions)
const { profile } = (await session.post('HeapProfiler.stopSampling')) as { profile: { head: ProfileNode } }
session.disconnect()

const bySite = new Map<string, number>()
let total = 0
const visit = (node: ProfileNode) => {
  const { functionName, url, lineNumber } = node.callFrame
  const file = url.replace(/^.*\/node_modules\/\.pnpm\//, '').replace(/^.*\/packages\//, '')
  const site = `${functionName || '(anonymous)'} ${file}:${lineNumber + 1}`
  bySite.set(site, (bySite.get(site) ?? 0) + node.selfSize)
  total += node.selfSize
  for (const child of node.children) visit(child)
}
visit(profile.head)
console.log(`${dist}: about ${Math.round(total / executions)} bytes allocated per first execution`)
for (const [site, bytes] of [...bySite].sort((a, b) => b[1] - a[1]).slice(0, Number(values.top)))
  console.log(`${String(Math.round(bytes / executions)).padStart(7)}  ${site}`)
await pool.query(`DROP SCHEMA ${schema} CASCADE`)
await pool.end()
