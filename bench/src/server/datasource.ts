// The two variants every database library gets: oncely on that library's datasource (the Fastify plugin, the INSERT
// through the library in the attempt's transaction), and the library's own baseline (the same INSERT through the same
// library in a transaction of its own, no idempotency), so each is divided by a baseline that pays the library's cost.
import { type Database, migrate, postgresStore } from '@oncely/server'
import { benchEngine } from './engines.js'
import { headerKey, type LedgerResponse, type Transfer } from './ledger.js'
import { type LedgerInsert, ledgerRoute, ONCELY_SCHEMA } from './oncely.js'
import type { Variant, VariantContext } from './variant.js'

/** A library opened on the bench database with `poolSize` connections. */
export interface OpenedLibrary<Tx> {
  /** oncely's datasource for it. */
  database: Database<Tx>
  /** The INSERT through the library, in its transaction object `tx`. */
  insert: LedgerInsert<Tx>
  /** BEGIN, the INSERT and COMMIT through the library's own transaction API: what a route without oncely runs. */
  transfer(key: string | undefined, transfer: Transfer): Promise<LedgerResponse>
  close(): Promise<void>
}

export interface Library<Tx> {
  /** The variants' names: `oncely-<name>` and `<name>-baseline`. */
  name: string
  /** The library and its version, for the report. */
  label: string
  open(context: VariantContext): Promise<OpenedLibrary<Tx>>
}

export function libraryVariants<Tx>(library: Library<Tx>): { oncely: Variant; baseline: Variant } {
  const oncelyName = `oncely-${library.name}`
  return {
    oncely: {
      name: oncelyName,
      description: `oncely (reservation: 'lock') on the ${library.label} datasource, Fastify plugin, the INSERT through ${library.label}`,
      async setup(scope, context) {
        const opened = await library.open(context)
        await migrate(opened.database as Database, { schema: ONCELY_SCHEMA })
        const engine = benchEngine(oncelyName, {
          store: postgresStore({ database: opened.database, schema: ONCELY_SCHEMA }),
          reservation: 'lock',
        })
        await ledgerRoute(scope, engine, opened.insert)
        return opened.close
      },
    },
    baseline: {
      name: `${library.name}-baseline`,
      description: `no idempotency layer: the INSERT in a transaction of ${library.label}`,
      async setup(scope, context) {
        const opened = await library.open(context)
        scope.post<{ Body: Transfer }>('/ledger', async (request, reply) => {
          const response = await opened.transfer(headerKey(request.headers['idempotency-key']), request.body)
          return reply.code(response.status).send(response.body)
        })
        return opened.close
      },
    },
  }
}

/** The response every variant gives for a new ledger row. */
export const created = (id: string | number | bigint, transfer: Transfer): LedgerResponse => ({
  status: 201,
  body: { id: String(id), account: transfer.account, amount: transfer.amount },
})
