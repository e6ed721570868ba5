// A callback-transaction library that fails before it calls back (no server to connect to) fails the session's
// BEGIN with the library's error; the ROLLBACK the engine sends after it must leave nothing unhandled (an unhandled
// rejection ends a Node process) and the engine answers `unavailable`.
import { freePort } from '@oncely/test-support'
import createKnex from 'knex'
import { Kysely, PostgresDialect } from 'kysely'
import pg from 'pg'
import { afterAll, describe, expect, it } from 'vitest'
import { createEngine, type Database, postgresStore } from '../../src/index.js'
import { knexDatabase } from '../../src/knex/index.js'
import { kyselyDatabase } from '../../src/kysely/index.js'
import { fingerprintOf, freshKey, reservation } from '../helpers.js'

// A port nothing listens on: every connection is refused at once.
const url = `postgres://postgres@127.0.0.1:${await freePort()}/none`
const closing: (() => Promise<void>)[] = []
afterAll(() => Promise.all(closing.map((close) => close())))

const datasources: Record<string, () => Database<unknown>> = {
  kysely: () => {
    const pool = new pg.Pool({ connectionString: url })
    const db = new Kysely<unknown>({ dialect: new PostgresDialect({ pool }) })
    closing.push(() => db.destroy())
    return kyselyDatabase({ db, pool }) as Database<unknown>
  },
  knex: () => {
    const knex = createKnex({ client: 'pg', connection: url, acquireConnectionTimeout: 500 })
    closing.push(() => knex.destroy())
    return knexDatabase({ knex }) as Database<unknown>
  },
}

describe.each(Object.keys(datasources))('%s without a server', (name) => {
  it('a session whose BEGIN failed rolls back quietly; the engine answers unavailable', async () => {
    const database = (datasources[name] as () => Database<unknown>)()
    const session = await database.session()
    await expect(session.run(['BEGIN'])).rejects.toThrow()
    await expect(session.run(['ROLLBACK'])).resolves.toBeDefined()
    session.release()
    const engine = createEngine<unknown>({
      store: postgresStore({ database }),
      reservation,
      replayCache: false,
    })
    const key = freshKey()
    const outcome = await engine.execute({
      scope: 'tenant',
      operation: 'POST /v1/payments',
      key,
      fingerprint: fingerprintOf({ key }),
      handler: async () => ({ status: 201 }),
    })
    expect(outcome).toMatchObject({ kind: 'unavailable' })
  })
})
