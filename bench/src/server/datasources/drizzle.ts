import { type DrizzleTransaction, drizzle } from '@oncely/server/drizzle'
import { drizzle as drizzleOrm } from 'drizzle-orm/node-postgres'
import { bigserial, integer, pgTable, text } from 'drizzle-orm/pg-core'
import pg from 'pg'
import { created, type Library, libraryVariants } from '../datasource.js'
import type { Transfer } from '../ledger.js'

const ledger = pgTable('ledger', {
  id: bigserial('id', { mode: 'number' }).primaryKey(),
  requestKey: text('request_key'),
  account: text('account').notNull(),
  amount: integer('amount').notNull(),
})

type Db = ReturnType<typeof drizzleOrm>
type Tx = DrizzleTransaction<Db>

const insert = async (tx: Tx | Db, key: string | undefined, transfer: Transfer) => {
  const [row] = await tx
    .insert(ledger)
    .values({ requestKey: key ?? null, account: transfer.account, amount: transfer.amount })
    .returning({ id: ledger.id })
  return created(row!.id, transfer)
}

/** Drizzle's query builder over node-postgres. */
export const drizzleLibrary: Library<Tx> = {
  name: 'drizzle',
  label: 'Drizzle 0.45.4 over node-postgres',
  async open({ databaseUrl, poolSize, idleMs }) {
    const pool = new pg.Pool({ connectionString: databaseUrl, max: poolSize, idleTimeoutMillis: idleMs })
    pool.on('error', () => {})
    const db = drizzleOrm(pool)
    return {
      database: drizzle({ db }),
      insert,
      transfer: (key, transfer) => db.transaction((tx) => insert(tx, key, transfer)),
      close: () => pool.end(),
    }
  },
}

export const { oncely: oncelyDrizzle, baseline: drizzleBaseline } = libraryVariants(drizzleLibrary)
