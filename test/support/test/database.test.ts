import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createTestDatabase, type TestDatabase } from '../src/index.js'

describe('createTestDatabase', () => {
  let a: TestDatabase
  let b: TestDatabase
  beforeAll(async () => {
    ;[a, b] = await Promise.all([createTestDatabase('support_a'), createTestDatabase('support_b')])
  })
  afterAll(async () => {
    await Promise.all([a?.drop(), b?.drop()])
  })

  it('gives each caller its own real, empty database', async () => {
    expect(a.name).not.toBe(b.name)
    await a.pool.query('CREATE TABLE t (id int PRIMARY KEY)')
    await a.pool.query('INSERT INTO t VALUES (1)')
    await expect(a.pool.query('INSERT INTO t VALUES (1)')).rejects.toMatchObject({ code: '23505' })
    const { rows } = await b.pool.query(`SELECT count(*)::int AS n FROM pg_tables WHERE tablename = 't'`)
    expect(rows[0].n).toBe(0)
  })

  it('drops the database', async () => {
    const scratch = await createTestDatabase('support_scratch')
    await scratch.drop()
    const { rows } = await a.pool.query('SELECT count(*)::int AS n FROM pg_database WHERE datname = $1', [
      scratch.name,
    ])
    expect(rows[0].n).toBe(0)
  })
})
