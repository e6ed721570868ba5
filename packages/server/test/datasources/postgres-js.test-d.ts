// The type of `ctx.tx` under the postgres.js datasource: the library's own `TransactionSql` (checked by `pnpm
// typecheck`).
import postgres, { type TransactionSql } from 'postgres'
import { expectTypeOf, test } from 'vitest'
import { createEngine, type Database, type ExecutionContext, postgresStore } from '../../src/index.js'
import { postgresJs } from '../../src/postgres-js/index.js'

test('ctx.tx is a postgres.js TransactionSql', () => {
  const sql = postgres('postgres://localhost/app')
  const database = postgresJs({ sql })
  expectTypeOf(database).toEqualTypeOf<Database<TransactionSql>>()
  const engine = createEngine({ store: postgresStore({ database }) })
  void engine.execute({
    scope: 't',
    operation: 'POST /v1/payments',
    key: 'k',
    fingerprint: 'f',
    handler: async (ctx) => {
      expectTypeOf(ctx).toEqualTypeOf<ExecutionContext<TransactionSql>>()
      expectTypeOf(ctx.tx).toEqualTypeOf<TransactionSql>()
      await ctx.tx`INSERT INTO payments (cart) VALUES (${'c'})`
      return { status: 201 }
    },
  })
})
