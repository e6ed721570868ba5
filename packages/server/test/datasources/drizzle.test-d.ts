// The type of `ctx.tx` under the Drizzle datasource: Drizzle's own transaction, typed with the schema, over
// node-postgres and over postgres.js (checked by `pnpm typecheck`).
import type { ExtractTablesWithRelations } from 'drizzle-orm'
import { drizzle as drizzleNodePostgres, type NodePgQueryResultHKT } from 'drizzle-orm/node-postgres'
import { integer, type PgTransaction, pgTable, text } from 'drizzle-orm/pg-core'
import { drizzle as drizzlePostgresJs, type PostgresJsQueryResultHKT } from 'drizzle-orm/postgres-js'
import pg from 'pg'
import postgres from 'postgres'
import { expectTypeOf, test } from 'vitest'
import { drizzle } from '../../src/drizzle/index.js'
import { createEngine, type ExecutionContext, postgresStore } from '../../src/index.js'

const payments = pgTable('payments', { cart: text('cart').notNull(), amount: integer('amount').notNull() })
const schema = { payments }

test('ctx.tx is a Drizzle transaction over node-postgres, with the schema', () => {
  const db = drizzleNodePostgres(new pg.Pool(), { schema })
  type Tx = Parameters<Parameters<typeof db.transaction>[0]>[0]
  expectTypeOf<Tx>().toEqualTypeOf<
    PgTransaction<NodePgQueryResultHKT, typeof schema, ExtractTablesWithRelations<typeof schema>>
  >()
  const engine = createEngine({ store: postgresStore({ database: drizzle({ db }) }) })
  void engine.execute({
    scope: 't',
    operation: 'POST /v1/payments',
    key: 'k',
    fingerprint: 'f',
    handler: async (ctx) => {
      expectTypeOf(ctx).toEqualTypeOf<ExecutionContext<Tx>>()
      expectTypeOf(ctx.tx).toEqualTypeOf<Tx>()
      await ctx.tx.insert(payments).values({ cart: 'c', amount: 100 })
      await ctx.tx.query.payments.findFirst()
      return { status: 201 }
    },
  })
})

test('ctx.tx is a Drizzle transaction over postgres.js', () => {
  const db = drizzlePostgresJs(postgres(), { schema })
  type Tx = Parameters<Parameters<typeof db.transaction>[0]>[0]
  expectTypeOf<Tx>().toEqualTypeOf<
    PgTransaction<PostgresJsQueryResultHKT, typeof schema, ExtractTablesWithRelations<typeof schema>>
  >()
  const engine = createEngine({ store: postgresStore({ database: drizzle({ db }) }) })
  void engine.execute({
    scope: 't',
    operation: 'POST /v1/payments',
    key: 'k',
    fingerprint: 'f',
    handler: async (ctx) => {
      expectTypeOf(ctx.tx).toEqualTypeOf<Tx>()
      await ctx.tx.insert(payments).values({ cart: 'c', amount: 100 })
      return { status: 201 }
    },
  })
})
