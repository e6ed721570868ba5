// Fastify's `tx` on PGlite's `Transaction`. `Register` holds for a whole program, so this file is one of its own
// (tsconfig.pglite.json, compiled by `pnpm typecheck`).
import type { PGlite, Transaction } from '@electric-sql/pglite'
import { expectTypeOf } from 'vitest'
import type { RegisteredTx } from '../../../src/fastify/index.js'
import { pglite } from '../../../src/pglite/index.js'
import { appOn } from './app.js'

type Tx = Transaction
declare module '../../../src/fastify/index.js' {
  interface Register {
    tx: Tx
  }
}
expectTypeOf<RegisteredTx>().toEqualTypeOf<Tx>()

appOn(pglite({ db: {} as PGlite }), async (tx) => {
  await tx.query('INSERT INTO payments (cart) VALUES ($1)', ['c'])
  // @ts-expect-error PGlite's transaction is not a Kysely one
  tx.insertInto('payments')
})
