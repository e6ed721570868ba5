// The engine's own CPU per first execution, without HTTP: engine.execute() under each protocol against the same
// statements written by hand (the floor), at a fixed concurrency, in this process. Prints microseconds of this
// process's CPU per request (process.cpuUsage) and each protocol's excess over the floor; asserts nothing.
//
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//     pnpm build && node --import tsx scripts/engine-cpu.ts [requests] [concurrency] [rounds]
import { createHash, randomUUID } from 'node:crypto'
import { readFileSync } from 'node:fs'
// The built package (run `pnpm build` first), as users run it: the sources through tsx carry its helpers.
import { createEngine, migrate, postgresStore } from '@oncely/server'
import { createTestDatabase } from '@oncely/test-support'
import type pg from 'pg'

const total = Number(process.argv[2] ?? 3_000)
const concurrency = Number(process.argv[3] ?? 10)
const rounds = Number(process.argv[4] ?? 3)

const db = await createTestDatabase('engine_cpu', { max: concurrency })
await migrate(db.pool)
await migrate(db.pool, { schema: 'floor' })
await db.pool.query('CREATE TABLE items (id bigserial PRIMARY KEY, tenant text NOT NULL, name text NOT NULL)')

const insert = (client: pg.ClientBase, name: string) =>
  client.query('INSERT INTO items (tenant, name) VALUES ($1, $2) RETURNING id', ['bench', name])

const engines = Object.fromEntries(
  (['row', 'lock'] as const).map((reservation) => [
    reservation,
    createEngine({ store: postgresStore({ pool: db.pool }), reservation, replayCache: false }),
  ]),
)

// The lock protocol's statements by hand: BEGIN + lock + lookup in one message, the insert, finish + COMMIT.
const T = 'floor.idempotency_keys'
const literal = (value: string) => `'${value.replaceAll("'", "''")}'`
const prepared = new WeakSet<pg.ClientBase>()
async function floor(key: string): Promise<void> {
  const client = await db.pool.connect()
  try {
    if (!prepared.has(client)) {
      await client.query(
        `PREPARE f_lock(text, text, text) AS SELECT pg_try_advisory_xact_lock(hashtextextended($1 || $2 || $3, 0)) AS locked, k.status FROM (SELECT 1) one LEFT JOIN ${T} k ON k.scope = $1 AND k.operation = $2 AND k.key = $3`,
      )
      await client.query(
        `PREPARE f_finish(text, text, text, text, integer, jsonb, bytea) AS INSERT INTO ${T} (scope, operation, key, fingerprint, status, attempts, created_at, updated_at, expires_at, response_status, response_headers, response_body) VALUES ($1, $2, $3, $4, 'succeeded', 1, now(), now(), now() + interval '1 day', $5, $6, $7)`,
      )
      prepared.add(client)
    }
    await client.query(`BEGIN; EXECUTE f_lock('bench', 'POST /items', ${literal(key)})`)
    const { rows } = await insert(client, key)
    const body = Buffer.from(JSON.stringify({ id: rows[0].id }))
    const fingerprint = createHash('sha256').update(key).digest('hex')
    await client.query(
      `EXECUTE f_finish('bench', 'POST /items', ${literal(key)}, ${literal(fingerprint)}, 201, '{"content-type":"application/json"}', decode('${body.toString('hex')}', 'hex')); COMMIT`,
    )
  } finally {
    client.release()
  }
}

const all: Record<string, (key: string) => Promise<unknown>> = {
  floor,
  ...Object.fromEntries(
    Object.entries(engines).map(([name, engine]) => [
      name,
      (key: string) =>
        engine.execute({
          scope: 'bench',
          operation: 'POST /items',
          key,
          fingerprint: createHash('sha256').update(key).digest('hex'),
          handler: async (ctx) => {
            const { rows } = await insert(ctx.tx, key)
            return { status: 201, body: { id: rows[0].id } }
          },
        }),
    ]),
  ),
}

const writeCalls = () => Number(/syscw: (\d+)/.exec(readFileSync('/proc/self/io', 'utf8'))?.[1] ?? 0)

async function measure(run: (key: string) => Promise<unknown>): Promise<{ cpuUs: number; rps: number }> {
  let next = 0
  const writes = writeCalls()
  const cpu = process.cpuUsage()
  const started = performance.now()
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next++ < total) await run(randomUUID())
    }),
  )
  const used = process.cpuUsage(cpu)
  console.log(`  ${((writeCalls() - writes) / total).toFixed(2)} write calls/request`)
  return { cpuUs: (used.user + used.system) / total, rps: total / ((performance.now() - started) / 1000) }
}

// ONLY=lock,floor runs a subset (to profile one variant on its own).
const only = process.env.ONLY?.split(',')
const variants = Object.fromEntries(Object.entries(all).filter(([name]) => !only || only.includes(name)))

const results: Record<string, number[]> = {}
for (const run of Object.values(variants)) await measure(run) // warm-up: JIT, prepared statements
for (let round = 0; round < rounds; round++) {
  for (const [name, run] of Object.entries(variants)) {
    const { cpuUs, rps } = await measure(run)
    results[name] = [...(results[name] ?? []), cpuUs]
    console.log(
      `round ${round + 1} ${name.padEnd(6)} ${cpuUs.toFixed(0).padStart(5)} us CPU/request ${rps.toFixed(0).padStart(6)} req/s`,
    )
  }
}
const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? 0
const floorUs = median(results.floor ?? [0])
for (const [name, values] of Object.entries(results)) {
  const us = median(values)
  console.log(
    `${name.padEnd(6)} median ${us.toFixed(0)} us/request, ${(us - floorUs).toFixed(0)} us above the floor`,
  )
}
await db.drop()
