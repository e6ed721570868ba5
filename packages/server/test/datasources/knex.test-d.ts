// Type tests (checked by `pnpm typecheck`): under the Knex datasource, a handler's `ctx.tx` is Knex's own
// `Knex.Transaction`, in the engine, in steps() and in the outbox.
import createKnex, { type Knex } from 'knex'
import { expectTypeOf } from 'vitest'
import { createEngine, type ExecutionContext, postgresStore } from '../../src/index.js'
import { knexDatabase } from '../../src/knex/index.js'
import { enqueue } from '../../src/outbox/index.js'
import { steps } from '../../src/steps/index.js'

const database = knexDatabase({ knex: createKnex({ client: 'pg' }) })
expectTypeOf(database.transaction<number>)
  .parameter(0)
  .parameter(0)
  .toEqualTypeOf<Knex.Transaction>()

const engine = createEngine({ store: postgresStore({ database }) })
void engine.execute({
  scope: 'tenant',
  operation: 'POST /v1/payments',
  key: 'k',
  fingerprint: 'f',
  handler: async (ctx) => {
    expectTypeOf(ctx.tx).toEqualTypeOf<Knex.Transaction>()
    await ctx.tx('payments').insert({ cart: 'c', amount: 100 })
    await enqueue(ctx.tx, { topic: 'payments', payload: {} }, { database })
    return { status: 201 }
  },
})

const handler = steps({
  database: knexDatabase({ knex: createKnex({ client: 'pg' }) }),
  steps: [
    {
      name: 'charge',
      run: async ({ tx }) => {
        expectTypeOf(tx).toEqualTypeOf<Knex.Transaction>()
        return {}
      },
    },
  ],
  finish: ({ tx }) => {
    expectTypeOf(tx).toEqualTypeOf<Knex.Transaction>()
    return { status: 201 }
  },
})
expectTypeOf(handler).parameter(0).toEqualTypeOf<ExecutionContext<Knex.Transaction>>()
