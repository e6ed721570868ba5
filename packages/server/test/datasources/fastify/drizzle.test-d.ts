// Fastify's `tx` on Drizzle over node-postgres: its `PgTransaction`, with the schema. `Register` holds for a whole program, so this file is one of its own
// (tsconfig.drizzle.json, compiled by `pnpm typecheck`).
import type { ExtractTablesWithRelations } from 'drizzle-orm'
import { drizzle as drizzleNodePostgres, type NodePgQueryResultHKT } from 'drizzle-orm/node-postgres'
import { integer, type PgTransaction, pgTable, text } from 'drizzle-orm/pg-core'
import type pg from 'pg'
import { expectTypeOf } from 'vitest'
import { drizzle } from '../../../src/drizzle/index.js'
import type { RegisteredTx } from '../../../src/fastify/index.js'
import { appOn } from './app.js'

const payments = pgTable('payments', { cart: text('cart').notNull(), amount: integer('amount').notNull() })
const schema = { payments }
type Tx = PgTransaction<NodePgQueryResultHKT, typeof schema, ExtractTablesWithRelations<typeof schema>>
declare module '../../../src/fastify/index.js' {
  interface Register {
    tx: Tx
  }
}
expectTypeOf<RegisteredTx>().toEqualTypeOf<Tx>()

appOn(drizzle({ db: drizzleNodePostgres({} as pg.Pool, { schema }) }), async (tx) => {
  await tx.insert(payments).values({ cart: 'c', amount: 100 })
  // @ts-expect-error Drizzle's `query` is its relational API, not node-postgres's query(text)
  await tx.query('SELECT 1')
})
