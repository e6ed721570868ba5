// Where the HTTP path allocates per first execution, by variant and by function: each variant's `POST /ledger` route
// (the Fastify app the bench server would run) driven in this process through `fastify.inject()`, under V8's
// sampling heap profiler with the objects garbage collection already freed counted too. The injection's own
// allocations are the same for every variant, so the differences between variants are what each layer adds: between
// `sql-floor` and `engine-floor` the engine, between `engine-floor` and `oncely-lock` the Fastify plugin. Like
// engine-allocations, and unlike CPU time or throughput, it repeats to about 1% on a busy machine. It runs the built
// packages, as the bench server does: `pnpm turbo run build --filter=./packages/*` after a change.
//
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test pnpm --filter @oncely/bench http-allocations -- \
//     [--variants baseline,sql-floor,engine-floor,oncely-lock] [--requests 4000] [--top 25] [--interval 128]
import { parseArgs } from 'node:util'
import { createTestDatabase } from '@oncely/test-support'
import Fastify, { type FastifyInstance } from 'fastify'
import pg from 'pg'
import { allocationsOf, largestSites } from './allocations.js'
import { LEDGER_SCHEMA } from './server/ledger.js'
import { REGISTRY } from './server/registry.js'

const { values } = parseArgs({
  args: process.argv.slice(2).filter((arg) => arg !== '--'),
  options: {
    variants: { type: 'string', default: 'baseline,sql-floor,engine-floor,oncely-lock' },
    requests: { type: 'string', default: '4000' },
    top: { type: 'string', default: '25' },
    interval: { type: 'string', default: '128' },
  },
})
const requests = Number(values.requests)
const variants = values.variants.split(',')
for (const name of variants) {
  const entry = REGISTRY[name]
  if (!entry) throw new Error(`unknown variant ${name} (known: ${Object.keys(REGISTRY).join(', ')})`)
}

const db = await createTestDatabase('http_allocations', { max: 4 })
await db.pool.query(LEDGER_SCHEMA)
const pool = new pg.Pool({ connectionString: db.url, max: 10 })
pool.on('error', () => {})

async function appOf(name: string): Promise<FastifyInstance> {
  const variant = await REGISTRY[name]!.load()
  if (!variant.setup)
    throw new Error(`${name} runs a server of its own framework; only Fastify variants are injected`)
  const app = Fastify({ logger: false })
  const setup = variant.setup
  await app.register(async (scope) => {
    await setup(scope, { pool, databaseUrl: db.url, poolSize: 10, idleMs: 10_000, redisUrl: '' })
  })
  await app.ready()
  return app
}

let sequence = 0
/** `count` first executions, 10 at a time, each with a new key; throws on any answer but 201. */
async function firstExecutions(app: FastifyInstance, count: number): Promise<void> {
  let next = 0
  await Promise.all(
    Array.from({ length: 10 }, async () => {
      while (next < count) {
        next++
        const response = await app.inject({
          method: 'POST',
          url: '/ledger',
          headers: {
            'content-type': 'application/json',
            'idempotency-key': `k-${process.pid}-${++sequence}`,
          },
          payload: '{"account":"acct-1","amount":100}',
        })
        if (response.statusCode !== 201)
          throw new Error(`expected 201, got ${response.statusCode}: ${response.body}`)
      }
    }),
  )
}

/** Bytes allocated per request by site, and in all. */
async function profile(app: FastifyInstance): Promise<{ total: number; sites: Map<string, number> }> {
  await firstExecutions(app, 1_500) // warm-up: prepared statements, optimised code
  return allocationsOf(() => firstExecutions(app, requests), requests, Number(values.interval))
}

const results = new Map<string, Awaited<ReturnType<typeof profile>>>()
for (const name of variants) {
  const app = await appOf(name)
  results.set(name, await profile(app))
  await app.close()
}

console.log('bytes allocated per first execution (the injection included, the same for every variant):')
for (const [name, { total }] of results) console.log(`${String(Math.round(total)).padStart(8)}  ${name}`)
const top = Number(values.top)
const last = variants.at(-1)!
const before = variants.at(-2)
for (const name of before ? [before, last] : [last]) {
  console.log(`\n${name}, the largest sites:`)
  const { sites } = results.get(name)!
  for (const line of largestSites(sites, top)) console.log(line)
}
if (before) {
  // The sites where the last variant allocates more than the one before it: what its layer adds.
  const base = results.get(before)!.sites
  const added = [...results.get(last)!.sites].map(
    ([site, bytes]) => [site, bytes - (base.get(site) ?? 0)] as const,
  )
  console.log(`\n${last} over ${before}, by site:`)
  for (const [site, bytes] of added.sort((a, b) => b[1] - a[1]).slice(0, top))
    console.log(`${String(Math.round(bytes)).padStart(7)}  ${site}`)
}
await pool.end()
await db.drop()
