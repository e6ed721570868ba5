// Type tests (checked by `pnpm typecheck`): under the Kysely datasource, a handler's `ctx.tx` is Kysely's own
// `Transaction<DB>` for the user's `DB`, in the engine, in steps() and in the outbox.
import { type Generated, Kysely, PostgresDialect, type Transaction } from 'kysely'
import pg from 'pg'
import { expectTypeOf } from 'vitest'
import { createEngine, type ExecutionContext, postgresStore } from '../../src/index.js'
import { kyselyDatabase } from '../../src/kysely/index.js'
import { enqueue } from '../../src/outbox/index.js'
import { steps } from '../../src/steps/index.js'

interface DB {
  payments: { id: Generated<string>; cart: string; amount: number }
}

const pool = new pg.Pool()
const db = new Kysely<DB>({ dialect: new PostgresDialect({ pool }) })
const database = kyselyDatabase({ db, pool })
expectTypeOf(database.transaction<number>)
  .parameter(0)
  .parameter(0)
  .toEqualTypeOf<Transaction<DB>>()

const engine = createEngine({ store: postgresStore({ database }) })
void engine.execute({
  scope: 'tenant',
  operation: 'POST /v1/payments',
  key: 'k',
  fingerprint: 'f',
  handler: async (ctx) => {
    expectTypeOf(ctx.tx).toEqualTypeOf<Transaction<DB>>()
    // The user's tables, typed: a wrong column does not compile.
    await ctx.tx.insertInto('payments').values({ cart: 'c', amount: 100 }).execute()
    // @ts-expect-error no such column
    await ctx.tx.insertInto('payments').values({ cart: 'c', amount: 100, nope: 1 }).execute()
    await enqueue(ctx.tx, { topic: 'payments', payload: {} }, { database })
    return { status: 201 }
  },
})

const secondPool = new pg.Pool()
const handler = steps({
  database: kyselyDatabase({
    db: new Kysely<DB>({ dialect: new PostgresDialect({ pool: secondPool }) }),
    pool: secondPool,
  }),
  steps: [
    {
      name: 'charge',
      run: async ({ tx }) => {
        expectTypeOf(tx).toEqualTypeOf<Transaction<DB>>()
        return {}
      },
    },
  ],
  finish: ({ tx }) => {
    expectTypeOf(tx).toEqualTypeOf<Transaction<DB>>()
    return { status: 201 }
  },
})
expectTypeOf(handler).parameter(0).toEqualTypeOf<ExecutionContext<Transaction<DB>>>()
