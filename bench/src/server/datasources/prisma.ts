import { type PrismaTransaction, prismaDatabase } from '@oncely/server/prisma'
import { PrismaPg } from '@prisma/adapter-pg'
// Generated from bench/prisma/schema.prisma by `pnpm bench` and `pnpm typecheck` (scripts/prisma-generate.mjs).
import { PrismaClient } from '../../../prisma/generated/client.js'
import { created, type Library, libraryVariants } from '../datasource.js'
import type { Transfer } from '../ledger.js'

type Tx = PrismaTransaction<PrismaClient>

const insert = async (tx: Tx, key: string | undefined, transfer: Transfer) => {
  const row = await tx.ledger.create({
    data: { requestKey: key ?? null, account: transfer.account, amount: transfer.amount },
    select: { id: true },
  })
  return created(row.id, transfer)
}

/** Prisma 7's client on @prisma/adapter-pg (node-postgres), with the side client oncely's datasource needs. */
export const prismaLibrary: Library<Tx> = {
  name: 'prisma',
  label: 'Prisma 7.10 with @prisma/adapter-pg',
  async open({ databaseUrl, poolSize, idleMs }) {
    const prisma = new PrismaClient({
      adapter: new PrismaPg({ connectionString: databaseUrl, max: poolSize, idleTimeoutMillis: idleMs }),
    })
    const side = new PrismaClient({
      adapter: new PrismaPg({ connectionString: databaseUrl, max: 2, idleTimeoutMillis: idleMs }),
    })
    return {
      database: prismaDatabase({ prisma, side }),
      insert,
      transfer: (key, transfer) => prisma.$transaction((tx) => insert(tx, key, transfer)),
      close: async () => {
        await Promise.all([prisma.$disconnect(), side.$disconnect()])
      },
    }
  },
}

export const { oncely: oncelyPrisma, baseline: prismaBaseline } = libraryVariants(prismaLibrary)
