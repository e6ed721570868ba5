import { createServer, type Server } from 'node:net'
import pg from 'pg'
import { afterAll, describe, expect, it } from 'vitest'
import { freePort, pgbouncerPath, startPgBouncer } from '../src/index.js'

const held: Server[] = []
afterAll(async () => {
  for (const server of held) await new Promise((resolve) => server.close(resolve))
})

/** A port something else listens on, as when another process takes the port between the pick and the bind. */
async function takenPort(): Promise<number> {
  const server = createServer()
  held.push(server)
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return (server.address() as { port: number }).port
}

describe.skipIf(!pgbouncerPath() && !process.env.CI)('startPgBouncer', () => {
  it('tries another port when the one it picked was taken before PgBouncer bound it', async () => {
    const taken = await takenPort()
    const picks = [taken]
    const bouncer = await startPgBouncer({ pickPort: async () => picks.shift() ?? freePort() })
    try {
      expect(bouncer.port).not.toBe(taken)
      const client = new pg.Client({ connectionString: bouncer.url('postgres') })
      await client.connect()
      try {
        expect((await client.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }])
      } finally {
        await client.end()
      }
    } finally {
      await bouncer.stop()
    }
  })
  it.each(['clean', 'crash'] as const)(
    'restarts on its port (%s): a client that lost its connection connects again at the same address',
    async (how) => {
      const bouncer = await startPgBouncer()
      try {
        const pool = new pg.Pool({ connectionString: bouncer.url('postgres'), max: 2 })
        pool.on('error', () => {})
        try {
          expect((await pool.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }])
          await bouncer.restart(how)
          // The pooled connection died with the old process; a query on it fails, the next one reconnects.
          await pool.query('SELECT 1').catch(() => {})
          expect((await pool.query('SELECT 2 AS two')).rows).toEqual([{ two: 2 }])
        } finally {
          await pool.end()
        }
      } finally {
        await bouncer.stop()
      }
    },
  )
})
