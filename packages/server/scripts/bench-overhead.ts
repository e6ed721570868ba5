// Quick measurement of what the idempotency layer costs: the same trivial INSERT handler behind Fastify, with and
// without oncely, over real sockets. Prints ratios; asserts nothing (the full benchmark is its own issue).
//
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//     node --conditions=@oncely/source --import tsx scripts/bench-overhead.ts [requests] [concurrency]
import { randomUUID } from 'node:crypto'
import { createTestDatabase } from '@oncely/test-support'
import Fastify from 'fastify'
import { fastifyIdempotency } from '../src/fastify/index.js'
import { createEngine, migrate, postgresStore } from '../src/index.js'

const total = Number(process.argv[2] ?? 2_000)
const concurrency = Number(process.argv[3] ?? 16)

const db = await createTestDatabase('bench', { max: concurrency })
await migrate(db.pool)
await db.pool.query('CREATE TABLE items (id bigserial PRIMARY KEY, tenant text NOT NULL, name text NOT NULL)')

const app = Fastify()
await app.register(fastifyIdempotency, {
  engine: createEngine({ store: postgresStore({ pool: db.pool }) }),
  tenant: () => 'bench',
})
app.post<{ Body: { name: string } }>('/plain', async (request, reply) => {
  const client = await db.pool.connect()
  try {
    await client.query('BEGIN')
    const { rows } = await client.query('INSERT INTO items (tenant, name) VALUES ($1, $2) RETURNING id', [
      'bench',
      request.body.name,
    ])
    await client.query('COMMIT')
    return reply.code(201).send({ id: rows[0].id })
  } finally {
    client.release()
  }
})
app.post<{ Body: { name: string } }>('/keyed', { config: { idempotency: true } }, async (request, reply) => {
  const { rows } = await request.idempotency.tx.query(
    'INSERT INTO items (tenant, name) VALUES ($1, $2) RETURNING id',
    ['bench', request.body.name],
  )
  return reply.code(201).send({ id: rows[0].id })
})
const url = await app.listen({ port: 0, host: '127.0.0.1' })

async function run(path: string, keyed: boolean, replay = false) {
  const latencies: number[] = []
  let next = 0
  const fixedKey = randomUUID()
  if (replay) {
    // The first request executes; the timed ones replay it.
    await fetch(`${url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': fixedKey },
      body: JSON.stringify({ name: 'x' }),
    }).then((r) => r.arrayBuffer())
  }
  const started = performance.now()
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next++ < total) {
        const t0 = performance.now()
        const response = await fetch(`${url}${path}`, {
          method: 'POST',
          headers: {
            'content-type': 'application/json',
            ...(keyed ? { 'idempotency-key': replay ? fixedKey : randomUUID() } : {}),
          },
          body: JSON.stringify({ name: 'x' }),
        })
        await response.arrayBuffer()
        if (response.status !== 201) throw new Error(`${path}: ${response.status}`)
        latencies.push(performance.now() - t0)
      }
    }),
  )
  const seconds = (performance.now() - started) / 1000
  latencies.sort((a, b) => a - b)
  const at = (q: number) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] ?? 0
  return { rps: total / seconds, p50: at(0.5), p99: at(0.99) }
}

await run('/plain', false) // warm-up
await run('/keyed', true)
const plain = await run('/plain', false)
const keyed = await run('/keyed', true)
const replay = await run('/keyed', true, true)
const fmt = (r: { rps: number; p50: number; p99: number }) =>
  `${r.rps.toFixed(0).padStart(6)} req/s  p50 ${r.p50.toFixed(2)} ms  p99 ${r.p99.toFixed(2)} ms`
console.log(`${total} requests, concurrency ${concurrency}`)
console.log(`without oncely      ${fmt(plain)}`)
console.log(`with oncely (new)   ${fmt(keyed)}`)
console.log(`with oncely (replay)${fmt(replay)}`)
console.log(
  `ratio new/plain: throughput ${(keyed.rps / plain.rps).toFixed(2)}x, p50 latency ${(keyed.p50 / plain.p50).toFixed(2)}x`,
)
await app.close()
await db.drop()
