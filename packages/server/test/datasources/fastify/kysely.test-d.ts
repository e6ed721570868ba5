// Fastify's `tx` on Kysely's `Transaction<DB>`. `Register` holds for a whole program, so this file is one of its own
// (tsconfig.kysely.json, compiled by `pnpm typecheck`).
import type { Generated, Kysely, Transaction } from 'kysely'
import type pg from 'pg'
import { expectTypeOf } from 'vitest'
import type { RegisteredTx } from '../../../src/fastify/index.js'
import { kyselyDatabase } from '../../../src/kysely/index.js'
import { appOn } from './app.js'

interface DB {
  payments: { id: Generated<string>; cart: string; amount: number }
}
type Tx = Transaction<DB>
declare module '../../../src/fastify/index.js' {
  interface Register {
    tx: Tx
  }
}
expectTypeOf<RegisteredTx>().toEqualTypeOf<Tx>()

appOn(kyselyDatabase({ db: {} as Kysely<DB>, pool: {} as pg.Pool }), async (tx) => {
  await tx.insertInto('payments').values({ cart: 'c', amount: 100 }).execute()
  // @ts-expect-error no such column
  await tx.insertInto('payments').values({ cart: 'c', amount: 100, nope: 1 }).execute()
})
