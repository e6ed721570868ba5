// Postgres backend CPU per first execution of the lock protocol's SQL, without HTTP or the engine: the messages the
// node-postgres datasource sends (captured from the engine's own prepared statements), the hand-written floor's
// (bench/src/server/sql-floor.ts), and variants of the engine's with one part taken out or changed, so each part's
// cost is read in one run. 10 connections run the transactions back to back; the CPU is the scheduler's count for
// their backends (/proc/<pid>/schedstat), which other work on the machine disturbs far less than a rate.
//
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test pnpm --filter @oncely/bench backend-cpu -- \
//     [--transactions 3000] [--rounds 5] [--connections 10]
import { readFileSync } from 'node:fs'
import { parseArgs } from 'node:util'
import { createEngine, migrate, postgresStore } from '@oncely/server'
import { createTestDatabase } from '@oncely/test-support'
import pg from 'pg'
import { floorSql } from './server/sql-floor.js'

const { values } = parseArgs({
  args: process.argv.slice(2).filter((arg) => arg !== '--'),
  options: {
    transactions: { type: 'string', default: '3000' },
    rounds: { type: 'string', default: '5' },
    connections: { type: 'string', default: '10' },
  },
})
const transactions = Number(values.transactions)
const connections = Number(values.connections)

const db = await createTestDatabase('backend_cpu', { max: 1 })
const S = 'oncely'
await migrate(db.pool, { schema: S })
await db.pool.query(`CREATE TABLE ledger (id bigserial PRIMARY KEY, k text)`)
const floor = floorSql(`${S}.idempotency_keys`)
const INSERT = 'INSERT INTO ledger (k) VALUES ($1)'
const response = { id: '1', account: 'acct-1', amount: 100 }

// The engine prepares its statements on the one connection of this pool; their texts are read back from it.
const pool = new pg.Pool({ connectionString: db.url, max: 1 })
const engine = createEngine({
  store: postgresStore({ pool, schema: S }),
  reservation: 'lock',
  replayCache: false,
})
await engine.execute({
  scope: 'bench',
  operation: 'POST /ledger',
  key: 'capture',
  fingerprint: 'f'.repeat(64),
  handler: async (ctx) => {
    await ctx.tx.query(INSERT, ['capture'])
    return { status: 201, headers: { 'content-type': 'application/json' }, body: response }
  },
})
const { rows: engineStatements } = await pool.query<{ name: string; statement: string }>(
  'SELECT name, statement FROM pg_prepared_statements',
)
await pool.end()
const named = (part: string) => {
  const found = engineStatements.find((s) => s.name.includes(part))
  if (!found) throw new Error(`the engine prepared no statement named like ${part}`)
  return { name: found.name, body: found.statement.replace(/^PREPARE [^)]*\) AS /, '') }
}
const lock = named('oncely_lock_')
const lookup = named('locked_lookup')
const finish = named('insert_finished')
const params = (text: string, count: number) => {
  let out = text
  for (let i = count; i >= 1; i--) out = out.replaceAll(`$${i}`, `p${i}`)
  return out
}

/** Statements each connection prepares: the engine's, the floor's, and those of the variants. */
const PREPARES = [
  ...engineStatements.map((s) => s.statement),
  ...floor.prepares,
  `PREPARE unguarded_lock(text, text, text, text) AS ${lock.body.replace(/ AND set_config\('idle_in_transaction_session_timeout', \$4, true\) IS NOT NULL/, '')}`,
  `PREPARE function_lock(text, text, text, text) AS SELECT * FROM ${S}.bench_lock_and_lookup($1, $2, $3, $4)`,
]
// The lock and the lookup in one statement, as a PL/pgSQL function whose second query takes its own snapshot.
await db.pool.query(`CREATE FUNCTION ${S}.bench_lock_and_lookup(p1 text, p2 text, p3 text, p4 text,
  OUT locked boolean, OUT server float8, OUT r text) LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  SELECT l.locked, l.server INTO locked, server FROM (${params(lock.body, 4)}) AS l;
  IF locked THEN
    SELECT x.r INTO r FROM (${params(lookup.body, 3)}) AS x;
  END IF;
END $fn$`)

const hex = Buffer.from(JSON.stringify(response)).toString('hex')
const FP = 'f'.repeat(64)
const id = (k: string) => `'bench', 'POST /ledger', '${k}'`
const engineFinish = (k: string) =>
  `EXECUTE ${finish.name}(${id(k)}, '${FP}', 'succeeded', 201, '{"content-type":"application/json"}', decode('${hex}', 'hex'), NULL, 86400000, 1); COMMIT`
/** Each variant's three messages: the reservation with its BEGIN, the handler's INSERT, the finish with its COMMIT. */
const VARIANTS: Record<string, (k: string) => [string, string]> = {
  'sql-floor': (k) => [floor.reserve.separate(id(k)), floor.finish(id(k), FP, hex)],
  'sql-floor-one-statement (unsafe)': (k) => [
    floor.reserve.oneStatement(id(k)),
    floor.finish(id(k), FP, hex),
  ],
  'oncely-lock': (k) => [
    `BEGIN; EXECUTE ${lock.name}(${id(k)}, '30000'); EXECUTE ${lookup.name}(${id(k)})`,
    engineFinish(k),
  ],
  'without the lookup': (k) => [`BEGIN; EXECUTE ${lock.name}(${id(k)}, '30000')`, engineFinish(k)],
  'without the lease guard': (k) => [
    `BEGIN; EXECUTE unguarded_lock(${id(k)}, '30000'); EXECUTE ${lookup.name}(${id(k)})`,
    engineFinish(k),
  ],
  "with the floor's finish": (k) => [
    `BEGIN; EXECUTE ${lock.name}(${id(k)}, '30000'); EXECUTE ${lookup.name}(${id(k)})`,
    floor.finish(id(k), FP, hex),
  ],
  'lock and lookup in one PL/pgSQL call': (k) => [
    `BEGIN; EXECUTE function_lock(${id(k)}, '30000')`,
    engineFinish(k),
  ],
}

const clients: pg.Client[] = []
const pids: number[] = []
for (let i = 0; i < connections; i++) {
  const client = new pg.Client({ connectionString: db.url })
  client.on('error', () => {})
  await client.connect()
  for (const text of PREPARES) await client.query(text)
  pids.push((await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid)
  clients.push(client)
}
const cpuUs = () =>
  pids.reduce(
    (sum, pid) => sum + Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]) / 1000,
    0,
  )

let sequence = 0
async function run(make: (k: string) => [string, string], count: number): Promise<void> {
  let left = count
  await Promise.all(
    clients.map(async (client) => {
      while (left-- > 0) {
        const key = `k-${process.pid}-${++sequence}`
        const [reserve, end] = make(key)
        await client.query(reserve)
        await client.query(INSERT, [key])
        await client.query(end)
      }
    }),
  )
}

const perTransaction = new Map<string, number[]>()
for (let round = 0; round < Number(values.rounds); round++) {
  for (const [name, make] of Object.entries(VARIANTS)) {
    await run(make, 200) // warm: plans cached, pages in memory
    const before = cpuUs()
    await run(make, transactions)
    perTransaction.set(name, [...(perTransaction.get(name) ?? []), (cpuUs() - before) / transactions])
  }
}
const median = (v: number[]) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!
const floorUs = median(perTransaction.get('sql-floor')!)
console.log(
  `backend CPU per first execution, ${connections} connections, ${transactions} transactions a round:`,
)
for (const [name, v] of perTransaction) {
  const m = median(v)
  console.log(
    `${name.padEnd(38)} ${m.toFixed(0).padStart(4)} us (${Math.min(...v).toFixed(0)}-${Math.max(...v).toFixed(0)}), ${(m - floorUs >= 0 ? '+' : '') + (m - floorUs).toFixed(0)} us against sql-floor`,
  )
}
for (const client of clients) await client.end()
await db.drop()
