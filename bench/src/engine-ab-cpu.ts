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
import { parseArgs } from 'node:util'
import { type BuildEngine, engineOfBuild, firstExecutions } from './engine-workload.js'
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

const schema = `engine_ab_${process.pid}`
const sides = {
  before: await engineOfBuild(before, databaseUrl, schema),
  after: await engineOfBuild(after, databaseUrl, schema),
}

/** Node CPU per first execution, in microseconds. */
async function cpuPerExecution({ engine }: BuildEngine): Promise<number> {
  const start = process.cpuUsage()
  await firstExecutions(engine, schema, executions)
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
await sides.before.pool.query(`DROP SCHEMA ${schema} CASCADE`)
await Promise.all([sides.before.pool.end(), sides.after.pool.end()])
