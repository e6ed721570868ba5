import { typeormDatabase } from '@oncely/server/typeorm'
import { DataSource, type EntityManager, EntitySchema } from 'typeorm'
import { created, type Library, libraryVariants } from '../datasource.js'
import type { Transfer } from '../ledger.js'

const Ledger = new EntitySchema<{ id: string; request_key: string | null; account: string; amount: number }>({
  name: 'Ledger',
  tableName: 'ledger',
  columns: {
    id: { type: 'bigint', primary: true, generated: 'increment' },
    request_key: { type: 'text', nullable: true },
    account: { type: 'text' },
    amount: { type: 'integer' },
  },
})

const insert = async (tx: EntityManager, key: string | undefined, transfer: Transfer) => {
  const result = await tx.insert(Ledger, {
    request_key: key ?? null,
    account: transfer.account,
    amount: transfer.amount,
  })
  return created(result.identifiers[0]!.id as string, transfer)
}

/** TypeORM's EntityManager on its postgres driver (node-postgres). */
export const typeormLibrary: Library<EntityManager> = {
  name: 'typeorm',
  label: 'TypeORM 0.3.31',
  async open({ databaseUrl, poolSize, idleMs }) {
    const dataSource = await new DataSource({
      type: 'postgres',
      url: databaseUrl,
      entities: [Ledger],
      poolSize,
      extra: { idleTimeoutMillis: idleMs },
    }).initialize()
    return {
      database: typeormDatabase({ dataSource }),
      insert,
      transfer: (key, transfer) => dataSource.transaction((tx) => insert(tx, key, transfer)),
      close: () => dataSource.destroy(),
    }
  },
}

export const { oncely: oncelyTypeorm, baseline: typeormBaseline } = libraryVariants(typeormLibrary)
