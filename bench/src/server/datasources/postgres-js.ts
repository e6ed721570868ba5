import { postgresJs } from '@oncely/server/postgres-js'
import postgres, { type TransactionSql } from 'postgres'
import { created, type Library, libraryVariants } from '../datasource.js'
import type { Transfer } from '../ledger.js'

const insert = async (tx: TransactionSql, key: string | undefined, transfer: Transfer) => {
  const [row] = await tx<{ id: string }[]>`INSERT INTO ledger (request_key, account, amount)
    VALUES (${key ?? null}, ${transfer.account}, ${transfer.amount}) RETURNING id`
  return created(row!.id, transfer)
}

/** postgres.js, which pipelines the statements of a transaction on its connection. */
export const postgresJsLibrary: Library<TransactionSql> = {
  name: 'postgres-js',
  label: 'postgres.js 3.4.9',
  async open({ databaseUrl, poolSize, idleMs }) {
    const sql = postgres(databaseUrl, { max: poolSize, idle_timeout: idleMs / 1000, onnotice: () => {} })
    return {
      database: postgresJs({ sql }),
      insert,
      transfer: (key, transfer) => sql.begin((tx) => insert(tx, key, transfer)),
      // postgres.js 3.4 can wait forever to end a connection Postgres closed: the timeout ends it.
      close: () => sql.end({ timeout: 1 }),
    }
  },
}

export const { oncely: oncelyPostgresJs, baseline: postgresJsBaseline } = libraryVariants(postgresJsLibrary)
