// The hand-written SQL floors answer as the lock protocol does: one execution per key, its response replayed, and a
// prompt 409 while another transaction holds the key. A floor that ran a key twice would flatter every ratio to it.
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import Fastify, { type FastifyInstance } from 'fastify'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { LEDGER_SCHEMA } from '../src/server/ledger.js'
import { sqlFloor, sqlFloorOneStatement } from '../src/server/sql-floor.js'

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('bench_floors', { max: 4 })
  await db.pool.query(LEDGER_SCHEMA)
})
afterAll(async () => {
  await db?.drop()
})

const transfer = { account: 'acct-1', amount: 100 }

describe.each([sqlFloor, sqlFloorOneStatement])('$name', (variant) => {
  let app: FastifyInstance
  let close = async () => {}
  beforeAll(async () => {
    app = Fastify()
    await app.register(async (scope) => {
      close = await variant.setup!(scope, {
        pool: db.pool,
        databaseUrl: db.url,
        poolSize: 4,
        idleMs: 1_000,
        redisUrl: 'redis://127.0.0.1:6379',
      })
    })
    await app.ready()
  })
  afterAll(async () => {
    await app?.close()
    await close()
  })

  const post = (key: string) =>
    app.inject({ method: 'POST', url: '/ledger', headers: { 'idempotency-key': key }, payload: transfer })
  const executions = async (key: string) =>
    (await db.pool.query('SELECT count(*)::int AS n FROM ledger WHERE request_key = $1', [key])).rows[0].n

  it('executes a key once and replays its response', async () => {
    const key = `${variant.name}-${crypto.randomUUID()}`
    const first = await post(key)
    expect(first.statusCode).toBe(201)
    const replay = await post(key)
    expect(replay.statusCode).toBe(201)
    expect(replay.json()).toEqual(first.json())
    expect(await executions(key)).toBe(1)
  })

  it('answers 409 at once while another transaction holds the key', async () => {
    const key = `${variant.name}-${crypto.randomUUID()}`
    const holder = await db.pool.connect()
    try {
      await holder.query('BEGIN')
      await holder.query(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, [
        `bench|POST /ledger|${key}`,
      ])
      expect((await post(key)).statusCode).toBe(409)
    } finally {
      await holder.query('ROLLBACK')
      holder.release()
    }
    expect((await post(key)).statusCode).toBe(201)
    expect(await executions(key)).toBe(1)
  })
})
