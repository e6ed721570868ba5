import { knexDatabase } from '@oncely/server/knex'
import createKnex, { type Knex } from 'knex'
import { created, type Library, libraryVariants } from '../datasource.js'
import type { Transfer } from '../ledger.js'

const insert = async (tx: Knex.Transaction, key: string | undefined, transfer: Transfer) => {
  const [row] = await tx('ledger')
    .insert({ request_key: key ?? null, account: transfer.account, amount: transfer.amount })
    .returning('id')
  return created(row.id, transfer)
}

/** Knex's query builder on its `pg` client. */
export const knexLibrary: Library<Knex.Transaction> = {
  name: 'knex',
  label: 'Knex 3.3.0',
  async open({ databaseUrl, poolSize, idleMs }) {
    const knex = createKnex({
      client: 'pg',
      connection: databaseUrl,
      pool: { min: 0, max: poolSize, idleTimeoutMillis: idleMs },
    })
    return {
      database: knexDatabase({ knex }),
      insert,
      transfer: (key, transfer) => knex.transaction((tx) => insert(tx, key, transfer)),
      close: () => knex.destroy(),
    }
  },
}

export const { oncely: oncelyKnex, baseline: knexBaseline } = libraryVariants(knexLibrary)
