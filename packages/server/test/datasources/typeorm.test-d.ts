// Type tests (checked by `pnpm typecheck`): under the TypeORM datasource, a handler's `ctx.tx` is TypeORM's own
// `EntityManager`, in the engine, in steps() and in the outbox.
import { DataSource, type EntityManager } from 'typeorm'
import { expectTypeOf } from 'vitest'
import { createEngine, type ExecutionContext, postgresStore } from '../../src/index.js'
import { enqueue } from '../../src/outbox/index.js'
import { steps } from '../../src/steps/index.js'
import { typeormDatabase } from '../../src/typeorm/index.js'

const database = typeormDatabase({ dataSource: new DataSource({ type: 'postgres' }) })
expectTypeOf(database.transaction<number>)
  .parameter(0)
  .parameter(0)
  .toEqualTypeOf<EntityManager>()

const engine = createEngine({ store: postgresStore({ database }) })
void engine.execute({
  scope: 'tenant',
  operation: 'POST /v1/payments',
  key: 'k',
  fingerprint: 'f',
  handler: async (ctx) => {
    expectTypeOf(ctx.tx).toEqualTypeOf<EntityManager>()
    await ctx.tx.query('INSERT INTO payments (cart, amount) VALUES ($1, $2)', ['c', 100])
    await enqueue(ctx.tx, { topic: 'payments', payload: {} }, { database })
    return { status: 201 }
  },
})

const handler = steps({
  database: typeormDatabase({ dataSource: new DataSource({ type: 'postgres' }) }),
  steps: [
    {
      name: 'charge',
      run: async ({ tx }) => {
        expectTypeOf(tx).toEqualTypeOf<EntityManager>()
        return {}
      },
    },
  ],
  finish: ({ tx }) => {
    expectTypeOf(tx).toEqualTypeOf<EntityManager>()
    return { status: 201 }
  },
})
expectTypeOf(handler).parameter(0).toEqualTypeOf<ExecutionContext<EntityManager>>()
