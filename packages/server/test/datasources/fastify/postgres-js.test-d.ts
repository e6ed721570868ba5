// Fastify's `tx` on postgres.js's `TransactionSql`. `Register` holds for a whole program, so this file is one of its own
// (tsconfig.postgres-js.json, compiled by `pnpm typecheck`).
import type { Sql, TransactionSql } from 'postgres'
import { expectTypeOf } from 'vitest'
import type { RegisteredTx } from '../../../src/fastify/index.js'
import { postgresJs } from '../../../src/postgres-js/index.js'
import { appOn } from './app.js'

type Tx = TransactionSql
declare module '../../../src/fastify/index.js' {
  interface Register {
    tx: Tx
  }
}
expectTypeOf<RegisteredTx>().toEqualTypeOf<Tx>()

appOn(postgresJs({ sql: {} as Sql }), async (tx) => {
  await tx`INSERT INTO payments (cart) VALUES (${'c'})`
  // @ts-expect-error postgres.js runs tagged templates, not node-postgres's query(text, values)
  await tx.query('SELECT 1', [])
})
