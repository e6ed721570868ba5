// Fastify's `tx` on Knex's `Knex.Transaction`. `Register` holds for a whole program, so this file is one of its own
// (tsconfig.knex.json, compiled by `pnpm typecheck`).
import type { Knex } from 'knex'
import { expectTypeOf } from 'vitest'
import type { RegisteredTx } from '../../../src/fastify/index.js'
import { knexDatabase } from '../../../src/knex/index.js'
import { appOn } from './app.js'

type Tx = Knex.Transaction
declare module '../../../src/fastify/index.js' {
  interface Register {
    tx: Tx
  }
}
expectTypeOf<RegisteredTx>().toEqualTypeOf<Tx>()

appOn(knexDatabase({ knex: {} as Knex }), async (tx) => {
  await tx('payments').insert({ cart: 'c', amount: 100 })
  // @ts-expect-error Knex's transaction is not Kysely's
  tx.insertInto('payments')
})
