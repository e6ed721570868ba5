// What a first execution costs Postgres, without HTTP: the hand-written floors' messages (bench/src/server/sql-floor.ts)
// against the engine's own, as its node-postgres datasource sends them (the engine runs, with its replay cache off,
// on a pool of its own). The business INSERT is the same in every variant. Two measures:
//
// - CPU (the default): `--connections` connections run the transactions back to back; the CPU is the scheduler's
//   count for their backends (/proc/<pid>/schedstat), which other work on the machine disturbs far less than a rate,
//   but still by a few percent.
// - Instructions (`--instructions`): a private Postgres started under callgrind (valgrind) runs each variant on one
//   connection; a transaction's instructions are the difference between a backend that ran `--transactions` of them
//   and one that ran a fifth as many, the key table emptied before each variant. Counted, not timed: two runs of one
//   build agree to about 1%, whatever else the machine does, so a change of a few thousand instructions is seen.
//   Needs valgrind and PostgreSQL's server binaries (`CITUS_PG_BINDIR`, default Debian's PostgreSQL 15); as root,
//   the server runs as the `postgres` OS user.
//
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test pnpm --filter @oncely/bench backend-cpu -- \
//     [--transactions 3000] [--rounds 5] [--connections 10]
//   pnpm --filter @oncely/bench backend-cpu -- --instructions [--transactions 500]
import { type ChildProcess, execFileSync, spawn } from 'node:child_process'
import { chownSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import net from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { parseArgs } from 'node:util'
import { createEngine, migrate, postgresStore } from '@oncely/server'
import { createTestDatabase } from '@oncely/test-support'
import pg from 'pg'
import { floorSql } from './server/sql-floor.js'

const { values } = parseArgs({
  args: process.argv.slice(2).filter((arg) => arg !== '--'),
  options: {
    transactions: { type: 'string' },
    rounds: { type: 'string', default: '5' },
    connections: { type: 'string', default: '10' },
    instructions: { type: 'boolean', default: false },
  },
})
const byInstructions = values.instructions
const transactions = Number(values.transactions ?? (byInstructions ? 500 : 3000))
const connections = byInstructions ? 1 : Number(values.connections)

const S = 'oncely'
const INSERT = 'INSERT INTO ledger (k) VALUES ($1) RETURNING id'
const FINGERPRINT = 'f'.repeat(64)
const floor = floorSql(`${S}.idempotency_keys`)

/** A variant: runs `count` first executions, `connections` at a time, on its own pool of `url`. */
type Variant = (pool: pg.Pool, count: number) => Promise<void>

let sequence = 0
const nextKey = () => `k-${process.pid}-${++sequence}`

/** Runs `work` `count` times, `connections` at a time. */
async function concurrently(count: number, work: () => Promise<void>): Promise<void> {
  let left = count
  await Promise.all(
    Array.from({ length: connections }, async () => {
      while (left-- > 0) await work()
    }),
  )
}

// The connections that prepared the floor's statements: kept across calls, since a variant runs on one pool round
// after round and a PREPARE of a name the connection holds fails.
const prepared = new WeakSet<pg.PoolClient>()

const floorVariant =
  (reserve: (id: string) => string): Variant =>
  async (pool, count) => {
    await concurrently(count, async () => {
      const key = nextKey()
      const id = `'bench', 'POST /ledger', '${key}'`
      const client = await pool.connect()
      try {
        if (!prepared.has(client)) {
          for (const text of floor.prepares) await client.query(text)
          prepared.add(client)
        }
        await client.query(reserve(id))
        const { rows } = await client.query(INSERT, [key])
        const body = Buffer.from(JSON.stringify({ id: rows[0].id, account: 'acct-1', amount: 100 }))
        await client.query(floor.finish(id, FINGERPRINT, body.toString('hex')))
      } finally {
        client.release()
      }
    })
  }

const engineVariant =
  (reservation: 'lock' | 'row'): Variant =>
  async (pool, count) => {
    const engine = createEngine({
      store: postgresStore({ pool, schema: S }),
      reservation,
      replayCache: false,
    })
    await concurrently(count, async () => {
      const key = nextKey()
      const outcome = await engine.execute({
        scope: 'bench',
        operation: 'POST /ledger',
        key,
        fingerprint: FINGERPRINT,
        handler: async (ctx) => {
          const { rows } = await ctx.tx.query(INSERT, [key])
          return { status: 201, body: { id: rows[0].id, account: 'acct-1', amount: 100 } }
        },
      })
      if (outcome.kind !== 'executed') throw new Error(`expected an execution, got ${outcome.kind}`)
    })
  }

const VARIANTS: Record<string, Variant> = {
  'sql-floor': floorVariant(floor.reserve.separate),
  'sql-floor-one-statement (unsafe)': floorVariant(floor.reserve.oneStatement),
  'oncely-lock': engineVariant('lock'),
  'oncely-row': engineVariant('row'),
}

async function setUp(pool: pg.Pool): Promise<void> {
  await migrate(pool, { schema: S })
  await pool.query('CREATE TABLE IF NOT EXISTS ledger (id bigserial PRIMARY KEY, k text)')
}

const median = (v: number[]) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!

function print(unit: string, results: Map<string, number[]>, scale: (n: number) => string): void {
  const floorValue = median(results.get('sql-floor')!)
  console.log(`Postgres ${unit} per first execution, ${transactions} transactions a measurement:`)
  for (const [name, v] of results) {
    const m = median(v)
    const spread = v.length > 1 ? ` (${scale(Math.min(...v))}-${scale(Math.max(...v))})` : ''
    console.log(
      `${name.padEnd(34)} ${scale(m).padStart(8)}${spread}, ${m - floorValue >= 0 ? '+' : ''}${scale(m - floorValue)} against sql-floor`,
    )
  }
}

if (byInstructions) await instructions()
else await cpu()

/** CPU of the backends by the scheduler's count, rounds of every variant in turn. */
async function cpu(): Promise<void> {
  const db = await createTestDatabase('backend_cpu', { max: 1 })
  await setUp(db.pool)
  const pools = new Map<string, pg.Pool>()
  const pidsOf = async (name: string) => {
    const { rows } = await db.pool.query<{ pid: number }>(
      'SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1',
      [`backend-cpu ${name}`],
    )
    return rows.map((row) => row.pid)
  }
  const cpuUs = (pids: number[]) =>
    pids.reduce((sum, pid) => {
      try {
        return sum + Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]) / 1000
      } catch {
        return sum // the backend ended
      }
    }, 0)
  const results = new Map<string, number[]>()
  for (const name of Object.keys(VARIANTS)) {
    const pool = new pg.Pool({
      connectionString: db.url,
      max: connections,
      idleTimeoutMillis: 0,
      application_name: `backend-cpu ${name}`,
    })
    pool.on('error', () => {})
    pools.set(name, pool)
    await VARIANTS[name]!(pool, 200 * connections) // warm: every connection open, plans cached, pages in memory
  }
  for (let round = 0; round < Number(values.rounds); round++) {
    for (const [name, variant] of Object.entries(VARIANTS)) {
      const pids = await pidsOf(name)
      const before = cpuUs(pids)
      await variant(pools.get(name)!, transactions)
      results.set(name, [...(results.get(name) ?? []), (cpuUs(pids) - before) / transactions])
    }
  }
  print('backend CPU (us)', results, (n) => n.toFixed(0))
  for (const pool of pools.values()) await pool.end()
  await db.drop()
}

/** Instructions under callgrind, on a private server. */
async function instructions(): Promise<void> {
  const bindir = process.env.CITUS_PG_BINDIR || '/usr/lib/postgresql/15/bin'
  if (!existsSync(path.join(bindir, 'postgres'))) throw new Error(`no PostgreSQL server at ${bindir}`)
  try {
    execFileSync('valgrind', ['--version'])
  } catch {
    throw new Error('--instructions needs valgrind (Debian: apt-get install valgrind)')
  }
  const dir = mkdtempSync(path.join(tmpdir(), 'oncely-backend-'))
  // initdb and postgres refuse to run as root: as root, both run as the `postgres` OS user.
  const owner =
    process.getuid?.() === 0
      ? {
          uid: Number(execFileSync('id', ['-u', 'postgres'], { encoding: 'utf8' })),
          gid: Number(execFileSync('id', ['-g', 'postgres'], { encoding: 'utf8' })),
        }
      : {}
  if (owner.uid !== undefined) chownSync(dir, owner.uid, owner.gid!)
  const data = path.join(dir, 'data')
  execFileSync(path.join(bindir, 'initdb'), ['-D', data, '-U', 'postgres', '--auth=trust', '--no-sync'], {
    ...owner,
    stdio: 'ignore',
  })
  const port = await new Promise<number>((resolve) => {
    const server = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo
      server.close(() => resolve(port))
    })
  })
  const server: ChildProcess = spawn(
    'valgrind',
    [
      '--tool=callgrind',
      `--callgrind-out-file=${dir}/callgrind.%p`,
      path.join(bindir, 'postgres'),
      '-D',
      data,
      '-p',
      String(port),
      '-c',
      'listen_addresses=127.0.0.1',
      '-c',
      'unix_socket_directories=',
      '-c',
      'autovacuum=off',
    ],
    { ...owner, stdio: 'ignore' },
  )
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`
  try {
    for (let tries = 0; ; tries++) {
      const client = new pg.Client({ connectionString: url })
      try {
        await client.connect()
        await client.end()
        break
      } catch (error) {
        if (tries > 120) throw error
        await new Promise((resolve) => setTimeout(resolve, 500))
      }
    }
    const admin = new pg.Pool({ connectionString: url, max: 1 })
    await setUp(admin)
    /** Instructions of one backend that ran `count` transactions of `variant`, once it exited. */
    const backend = async (variant: Variant, count: number): Promise<number> => {
      const pool = new pg.Pool({ connectionString: url, max: 1 })
      const client = await pool.connect()
      const pid = (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid
      client.release()
      await variant(pool, count)
      await pool.end()
      const file = path.join(dir, `callgrind.${pid}`)
      for (let waited = 0; !(existsSync(file) && readFileSync(file, 'utf8').includes('totals:')); waited++) {
        if (waited > 600) throw new Error(`callgrind wrote no totals for backend ${pid}`)
        await new Promise((resolve) => setTimeout(resolve, 100))
      }
      return Number(/totals: (\d+)/.exec(readFileSync(file, 'utf8'))![1])
    }
    const fewer = Math.max(20, Math.round(transactions / 5))
    const results = new Map<string, number[]>()
    for (const [name, variant] of Object.entries(VARIANTS)) {
      await admin.query(`TRUNCATE ${S}.idempotency_keys, ledger`)
      await admin.query('CHECKPOINT')
      await backend(variant, 30) // warm the server's caches of the tables and indexes this variant touches
      const few = await backend(variant, fewer)
      const many = await backend(variant, transactions)
      results.set(name, [(many - few) / (transactions - fewer)])
    }
    print('instructions (thousands)', results, (n) => (n / 1000).toFixed(1))
    await admin.end()
  } finally {
    server.kill('SIGINT')
    await new Promise((resolve) => server.once('exit', resolve))
    rmSync(dir, { recursive: true, force: true })
  }
}
