// Every oncely variant of the bench server builds the reservation protocol its name says: `oncely-row*` the row
// protocol, every other `oncely*` the lock protocol (the default). Each is set up for real, on a real Postgres, and
// the protocol read from the engine it built. A variant named for one protocol once measured the other.

import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import Fastify from 'fastify'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { builtProtocol } from '../src/server/engines.js'
import { LEDGER_SCHEMA } from '../src/server/ledger.js'
import { REGISTRY } from '../src/server/registry.js'
import type { VariantContext } from '../src/server/variant.js'

let db: TestDatabase
let context: VariantContext
beforeAll(async () => {
  db = await createTestDatabase('bench_variants', { max: 4 })
  await db.pool.query(LEDGER_SCHEMA)
  context = {
    pool: db.pool,
    databaseUrl: db.url,
    poolSize: 2,
    idleMs: 1_000,
    redisUrl: 'redis://127.0.0.1:6379',
  }
})
afterAll(async () => {
  await db?.drop()
})

const oncelyVariants = Object.keys(REGISTRY).filter((name) => name.startsWith('oncely'))

it('has oncely variants of both protocols to check', () => {
  expect(oncelyVariants.filter((name) => name.startsWith('oncely-row')).length).toBeGreaterThan(0)
  expect(oncelyVariants.filter((name) => !name.startsWith('oncely-row')).length).toBeGreaterThan(0)
})

it.each(oncelyVariants)('%s builds the protocol its name says', async (name) => {
  const variant = await REGISTRY[name]!.load()
  expect(variant.name).toBe(name)
  if (variant.listen) {
    const server = await variant.listen(context)
    await server.close()
  } else {
    const app = Fastify()
    let close = async () => {}
    await app.register(async (scope) => {
      close = await variant.setup(scope, context)
    })
    await app.ready()
    await app.close()
    await close()
  }
  expect(builtProtocol(name)).toBe(name.startsWith('oncely-row') ? 'row' : 'lock')
})
