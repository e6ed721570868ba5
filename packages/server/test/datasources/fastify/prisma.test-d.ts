// Fastify's `tx` on Prisma's interactive-transaction client of the app's `PrismaClient`. `Register` holds for a whole program, so this file is one of its own
// (tsconfig.prisma.json, compiled by `pnpm typecheck`).

import { expectTypeOf } from 'vitest'
import type { RegisteredTx } from '../../../src/fastify/index.js'
import { type PrismaTransaction, prismaDatabase } from '../../../src/prisma/index.js'
import type { PrismaClient } from '../prisma/generated/client.js'
import { appOn } from './app.js'

type Tx = PrismaTransaction<PrismaClient>
declare module '../../../src/fastify/index.js' {
  interface Register {
    tx: Tx
  }
}
expectTypeOf<RegisteredTx>().toEqualTypeOf<Tx>()

appOn(prismaDatabase({ prisma: {} as PrismaClient, side: {} as PrismaClient }), async (tx) => {
  await tx.payment.create({ data: { tenant: 't', cart: 'c', amount: 100 } })
  // @ts-expect-error a model the schema does not have
  await tx.refund.create({ data: {} })
})
