// What @oncely/server/otel costs in CPU per execution, without HTTP: `engine.execute()` of `reservation: 'lock'`
// bare, instrumented with no SDK, and instrumented with an SDK recording every metric and sampling every span (or
// `--span-ratio` of them), 10 concurrent executions, rotated rounds in one process, CPU from process.cpuUsage().
// Replays (the default) are served from the replay cache, so no database time hides the instrumentation's.
//
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test pnpm --filter @oncely/bench otel-cpu -- [--path replay|first]
//     [--executions 6000] [--rounds 7] [--span-ratio 1]
import { randomUUID } from 'node:crypto'
import { parseArgs } from 'node:util'
import { createEngine, type Engine, migrate, postgresStore } from '@oncely/server'
import { instrumentEngine } from '@oncely/server/otel'
import pg from 'pg'
import { recordingTelemetry, registerOtelContext } from './server/otel.js'
import { median } from './stats.js'

const { values } = parseArgs({
  args: process.argv.slice(2).filter((arg) => arg !== '--'),
  options: {
    path: { type: 'string', default: 'replay' },
    executions: { type: 'string', default: '6000' },
    rounds: { type: 'string', default: '7' },
    'span-ratio': { type: 'string', default: '1' },
  },
})
const path = values.path
if (path !== 'replay' && path !== 'first') throw new Error(`--path must be replay or first, not ${path}`)
const executions = Number(values.executions)
const rounds = Number(values.rounds)
const spanRatio = Number(values['span-ratio'])
const databaseUrl = process.env.DATABASE_URL
if (!databaseUrl) throw new Error('DATABASE_URL is required')

// As the Node SDK does, for all three sides: the context manager's own cost is not the instrumentation's.
registerOtelContext()
const pool = new pg.Pool({ connectionString: databaseUrl, max: 10 })
pool.on('error', () => {})
const schema = `otel_cpu_${process.pid}`
await migrate(pool, { schema })
const engine = createEngine({ store: postgresStore({ pool, schema }), reservation: 'lock' })
const sdk = recordingTelemetry(spanRatio)
const sides: Array<[string, Engine]> = [
  ['bare', engine],
  ['instrumented, no SDK', instrumentEngine(engine, {})],
  [`instrumented, SDK (spans sampled at ${spanRatio})`, instrumentEngine(engine, sdk)],
]

async function cpuPerExecution(side: Engine, tag: string): Promise<number> {
  const input = (key: string) => ({
    scope: 'bench',
    operation: 'POST /ledger',
    key,
    fingerprint: 'f'.repeat(64),
    handler: async () => ({ status: 201, headers: {}, body: { ok: true } }),
  })
  const keys = Array.from({ length: executions }, (_, i) => `${tag}-${i}`)
  if (path === 'replay') for (const key of keys) await side.execute(input(key))
  const start = process.cpuUsage()
  let next = 0
  await Promise.all(
    Array.from({ length: 10 }, async () => {
      while (next < executions) await side.execute(input(keys[next++]!))
    }),
  )
  const used = process.cpuUsage(start)
  return (used.user + used.system) / executions
}

const samples = new Map<string, number[]>(sides.map(([name]) => [name, []]))
try {
  for (let round = 0; round < rounds; round++) {
    // Rotate the order every round, so drift over a round hits every side alike.
    for (let i = 0; i < sides.length; i++) {
      const [name, side] = sides[(round + i) % sides.length]!
      samples.get(name)!.push(await cpuPerExecution(side, `${round}-${randomUUID().slice(0, 8)}`))
    }
  }
  const bare = median(samples.get('bare')!)
  console.log(`| setup | CPU per ${path} execution, median of ${rounds} | added | per round |`)
  console.log('| --- | --- | --- | --- |')
  for (const [name, values] of samples) {
    const us = median(values)
    console.log(
      `| ${name} | ${us.toFixed(1)} us | ${name === 'bare' ? '' : `${(us - bare).toFixed(1)} us`} | ${values.map((v) => v.toFixed(0)).join(', ')} |`,
    )
  }
} finally {
  await pool.query(`DROP SCHEMA ${schema} CASCADE`)
  await sdk.close()
  await pool.end()
}
