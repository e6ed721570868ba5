import { kyselyDatabase } from '@oncely/server/kysely'
import { type Generated, Kysely, PostgresDialect, type Transaction } from 'kysely'
import pg from 'pg'
import { created, type Library, libraryVariants } from '../datasource.js'
import type { Transfer } from '../ledger.js'

interface DB {
  ledger: { id: Generated<string>; request_key: string | null; account: string; amount: number }
}

const insert = async (tx: Transaction<DB>, key: string | undefined, transfer: Transfer) => {
  const { id } = await tx
    .insertInto('ledger')
    .values({ request_key: key ?? null, account: transfer.account, amount: transfer.amount })
    .returning('id')
    .executeTakeFirstOrThrow()
  return created(id, transfer)
}

/** Kysely's query builder on its PostgresDialect (node-postgres). */
export const kyselyLibrary: Library<Transaction<DB>> = {
  name: 'kysely',
  label: 'Kysely 0.28.19',
  async open({ databaseUrl, poolSize, idleMs }) {
    const pool = new pg.Pool({ connectionString: databaseUrl, max: poolSize, idleTimeoutMillis: idleMs })
    pool.on('error', () => {})
    const db = new Kysely<DB>({ dialect: new PostgresDialect({ pool }) })
    return {
      database: kyselyDatabase({ db, pool }),
      insert,
      transfer: (key, transfer) => db.transaction().execute((tx) => insert(tx, key, transfer)),
      close: () => db.destroy(),
    }
  },
}

export const { oncely: oncelyKysely, baseline: kyselyBaseline } = libraryVariants(kyselyLibrary)
