// Fastify's `tx` on TypeORM's `EntityManager`. `Register` holds for a whole program, so this file is one of its own
// (tsconfig.typeorm.json, compiled by `pnpm typecheck`).
import type { DataSource, EntityManager } from 'typeorm'
import { expectTypeOf } from 'vitest'
import type { RegisteredTx } from '../../../src/fastify/index.js'
import { typeormDatabase } from '../../../src/typeorm/index.js'
import { appOn } from './app.js'

type Tx = EntityManager
declare module '../../../src/fastify/index.js' {
  interface Register {
    tx: Tx
  }
}
expectTypeOf<RegisteredTx>().toEqualTypeOf<Tx>()

appOn(typeormDatabase({ dataSource: {} as DataSource }), async (tx) => {
  await tx.query('INSERT INTO payments (cart, amount) VALUES ($1, $2)', ['c', 100])
  // @ts-expect-error an EntityManager is not a Kysely transaction
  tx.insertInto('payments')
})
