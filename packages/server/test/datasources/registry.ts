// Every datasource the contract suite (contract.test.ts) runs under, each as the same small shape: a datasource on a
// database URL, and the business writes and counts made through that library itself, so an effect counted by a test
// is one the library made in the handler's transaction. vitest.config.ts runs the suite once per datasource and
// protocol (ONCELY_TEST_DATASOURCE names the entry).

import type { Transaction as PGliteTransaction } from '@electric-sql/pglite'
import { count, eq } from 'drizzle-orm'
import { drizzle as drizzleNodePostgres } from 'drizzle-orm/node-postgres'
import { bigserial, integer, pgTable, text } from 'drizzle-orm/pg-core'
import { drizzle as drizzlePostgresJs } from 'drizzle-orm/postgres-js'
import createKnex, { type Knex } from 'knex'
import { type Generated, Kysely, PostgresDialect, sql, type Transaction } from 'kysely'
import pg from 'pg'
import postgres, { type TransactionSql } from 'postgres'
import { DataSource, type EntityManager, EntitySchema } from 'typeorm'
import { drizzle } from '../../src/drizzle/index.js'
import { type Database, nodePostgres } from '../../src/index.js'
import { knexDatabase } from '../../src/knex/index.js'
import { kyselyDatabase } from '../../src/kysely/index.js'
import { pglite } from '../../src/pglite/index.js'
import { postgresJs } from '../../src/postgres-js/index.js'
import type { PrismaTransaction } from '../../src/prisma/index.js'
import { typeormDatabase } from '../../src/typeorm/index.js'
import { freshPGlite } from './fresh-pglite.js'
import type { PrismaClient } from './prisma/generated/client.js'

/** One library under test. */
export interface DatasourceUnderTest<Tx = unknown> {
  /** The datasource of the engine under test. */
  database: Database<Tx>
  /**
   * A second datasource of the same library on the same database with connections of its own (what `steps()` and
   * other layers that open transactions of their own are given).
   */
  second: Database<Tx>
  /** Books one payment for `cart` through the library, in `tx`. */
  pay(tx: Tx, cart: string): Promise<void>
  /** Payments booked for `cart`, counted through the library. */
  payments(cart: string): Promise<number>
  /** Closes what it opened. */
  close(): Promise<void>
}

/** Opens a library on a database whose `payments (tenant text, cart text, amount integer)` table exists. */
export type OpenDatasource = (url: string) => Promise<DatasourceUnderTest>

/**
 * The writes of the sabotaged run (ONCELY_TEST_SABOTAGE=second-connection): `pay` writes through the library's
 * own handle, outside the handler's transaction, as a handler that forgot `ctx.tx` would. The suite must fail then:
 * it is how it shows it can see the crash window a datasource guards.
 */
export const sabotaged = process.env.ONCELY_TEST_SABOTAGE === 'second-connection'

function nodePostgresUnderTest(url: string): Promise<DatasourceUnderTest<pg.PoolClient>> {
  const pool = new pg.Pool({ connectionString: url, max: 10 })
  const secondPool = new pg.Pool({ connectionString: url, max: 5 })
  for (const each of [pool, secondPool]) each.on('error', () => {})
  return Promise.resolve({
    database: nodePostgres({ pool }),
    second: nodePostgres({ pool: secondPool }),
    async pay(tx, cart) {
      const on = sabotaged ? pool : tx
      await on.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 100)', ['t', cart])
    },
    async payments(cart) {
      const { rows } = await pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [cart])
      return rows[0].n
    },
    async close() {
      await Promise.all([pool.end(), secondPool.end()])
    },
  })
}

async function postgresJsUnderTest(url: string): Promise<DatasourceUnderTest<TransactionSql>> {
  const options = { max: 10, onnotice: () => {} }
  const sql = postgres(url, options)
  const secondSql = postgres(url, { ...options, max: 5 })
  return {
    database: postgresJs({ sql }),
    second: postgresJs({ sql: secondSql }),
    async pay(tx, cart) {
      const on = sabotaged ? sql : tx
      await on`INSERT INTO payments (tenant, cart, amount) VALUES (${'t'}, ${cart}, 100)`
    },
    async payments(cart) {
      const [row] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM payments WHERE cart = ${cart}`
      return row?.n ?? 0
    },
    async close() {
      // postgres.js 3.4 waits forever to end a connection that Postgres closed under a statement (an attempt that
      // stalled past its lease): the timeout ends such connections.
      await Promise.all([sql.end({ timeout: 1 }), secondSql.end({ timeout: 1 })])
    },
  }
}

const payments = pgTable('payments', {
  id: bigserial('id', { mode: 'number' }).primaryKey(),
  tenant: text('tenant').notNull(),
  cart: text('cart').notNull(),
  amount: integer('amount').notNull(),
})

/** Drizzle over `client`: writes with its query builder, in the handler's Drizzle transaction. */
function drizzleUnderTest<
  DB extends ReturnType<typeof drizzleNodePostgres> | ReturnType<typeof drizzlePostgresJs>,
>(db: DB, second: DB, close: () => Promise<void>): DatasourceUnderTest {
  return {
    database: drizzle({ db }) as Database,
    second: drizzle({ db: second }) as Database,
    async pay(tx, cart) {
      const on = sabotaged ? db : (tx as DB)
      await on.insert(payments).values({ tenant: 't', cart, amount: 100 })
    },
    async payments(cart) {
      const [row] = await db.select({ n: count() }).from(payments).where(eq(payments.cart, cart))
      return row?.n ?? 0
    },
    close,
  }
}

async function drizzleNodePostgresUnderTest(url: string): Promise<DatasourceUnderTest> {
  const pool = new pg.Pool({ connectionString: url, max: 10 })
  const secondPool = new pg.Pool({ connectionString: url, max: 5 })
  for (const each of [pool, secondPool]) each.on('error', () => {})
  return drizzleUnderTest(drizzleNodePostgres(pool), drizzleNodePostgres(secondPool), async () => {
    await Promise.all([pool.end(), secondPool.end()])
  })
}

async function drizzlePostgresJsUnderTest(url: string): Promise<DatasourceUnderTest> {
  const options = { max: 10, onnotice: () => {} }
  const sql = postgres(url, options)
  const secondSql = postgres(url, { ...options, max: 5 })
  return drizzleUnderTest(drizzlePostgresJs(sql), drizzlePostgresJs(secondSql), async () => {
    // See postgresJsUnderTest.
    await Promise.all([sql.end({ timeout: 1 }), secondSql.end({ timeout: 1 })])
  })
}

/** The business tables as Kysely sees them. */
interface PaymentsDB {
  payments: { id: Generated<string>; tenant: string; cart: string; amount: number }
}

function kyselyUnderTest(url: string): Promise<DatasourceUnderTest<Transaction<PaymentsDB>>> {
  const pool = new pg.Pool({ connectionString: url, max: 10 })
  const secondPool = new pg.Pool({ connectionString: url, max: 5 })
  const db = new Kysely<PaymentsDB>({ dialect: new PostgresDialect({ pool }) })
  const secondDb = new Kysely<PaymentsDB>({ dialect: new PostgresDialect({ pool: secondPool }) })
  return Promise.resolve({
    database: kyselyDatabase({ db, pool }),
    second: kyselyDatabase({ db: secondDb, pool: secondPool }),
    async pay(tx, cart) {
      await (sabotaged ? db : tx).insertInto('payments').values({ tenant: 't', cart, amount: 100 }).execute()
    },
    async payments(cart) {
      const { n } = await db
        .selectFrom('payments')
        .select(sql<number>`count(*)::int`.as('n'))
        .where('cart', '=', cart)
        .executeTakeFirstOrThrow()
      return n
    },
    async close() {
      await Promise.all([db.destroy(), secondDb.destroy()])
    },
  })
}

function knexUnderTest(url: string): Promise<DatasourceUnderTest<Knex.Transaction>> {
  const db = createKnex({ client: 'pg', connection: url, pool: { min: 0, max: 10 } })
  const secondDb = createKnex({ client: 'pg', connection: url, pool: { min: 0, max: 5 } })
  return Promise.resolve({
    database: knexDatabase({ knex: db }),
    second: knexDatabase({ knex: secondDb }),
    async pay(tx, cart) {
      await (sabotaged ? db : tx)('payments').insert({ tenant: 't', cart, amount: 100 })
    },
    async payments(cart) {
      const [row] = await db('payments').where({ cart }).count({ n: '*' })
      return Number(row?.n)
    },
    async close() {
      await Promise.all([db.destroy(), secondDb.destroy()])
    },
  })
}

/** The payments table as TypeORM maps it. */
const Payment = new EntitySchema<{ id: string; tenant: string; cart: string; amount: number }>({
  name: 'Payment',
  tableName: 'payments',
  columns: {
    id: { type: 'bigint', primary: true, generated: 'increment' },
    tenant: { type: 'text' },
    cart: { type: 'text' },
    amount: { type: 'integer' },
  },
})

async function typeormUnderTest(url: string): Promise<DatasourceUnderTest<EntityManager>> {
  const open = (poolSize: number) =>
    new DataSource({ type: 'postgres', url, entities: [Payment], poolSize }).initialize()
  const [dataSource, secondDataSource] = await Promise.all([open(10), open(5)])
  return {
    database: typeormDatabase({ dataSource }),
    second: typeormDatabase({ dataSource: secondDataSource }),
    async pay(tx, cart) {
      await (sabotaged ? dataSource.manager : tx).insert(Payment, { tenant: 't', cart, amount: 100 })
    },
    payments: (cart) => dataSource.getRepository(Payment).countBy({ cart }),
    async close() {
      await Promise.all([dataSource.destroy(), secondDataSource.destroy()])
    },
  }
}

// The client generated from prisma/schema.prisma (a `Payment` model on `payments`) by the tests' global setup,
// loaded only when this datasource is tested.
async function prismaUnderTest(url: string): Promise<DatasourceUnderTest<PrismaTransaction<PrismaClient>>> {
  const [{ PrismaClient }, { PrismaPg }, { prismaDatabase }] = await Promise.all([
    import('./prisma/generated/client.js'),
    import('@prisma/adapter-pg'),
    import('../../src/prisma/index.js'),
  ])
  const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: url, max: 10 }) })
  const side = new PrismaClient({ adapter: new PrismaPg({ connectionString: url, max: 2 }) })
  const secondPrisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: url, max: 5 }) })
  const secondSide = new PrismaClient({ adapter: new PrismaPg({ connectionString: url, max: 2 }) })
  return {
    database: prismaDatabase({ prisma, side }),
    second: prismaDatabase({ prisma: secondPrisma, side: secondSide }),
    async pay(tx, cart) {
      await (sabotaged ? prisma : tx).payment.create({ data: { tenant: 't', cart, amount: 100 } })
    },
    payments: (cart) => prisma.payment.count({ where: { cart } }),
    async close() {
      await Promise.all([prisma, side, secondPrisma, secondSide].map((client) => client.$disconnect()))
    },
  }
}

/**
 * PGlite, in memory, on a database of its own (the URL is not used): the suite creates its tables through the
 * datasource. It has one connection, so there is no `second` of its own (the cases that need one are left out, see
 * contract.test.ts). A sabotaged `pay` cannot wait for its write: outside the transaction it would wait for the
 * connection the handler's own transaction holds, for ever. It sends the write without waiting, which then commits
 * after the transaction ended, whatever its outcome.
 */
async function pgliteUnderTest(): Promise<DatasourceUnderTest<PGliteTransaction>> {
  const db = await freshPGlite()
  const database = pglite({ db })
  const insert = 'INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 100)'
  return {
    database,
    second: database,
    async pay(tx, cart) {
      if (sabotaged) void db.query(insert, ['t', cart]).catch(() => {})
      else await tx.query(insert, ['t', cart])
    },
    async payments(cart) {
      const { rows } = await db.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM payments WHERE cart = $1',
        [cart],
      )
      return rows[0]?.n ?? 0
    },
    close: () => db.close(),
  }
}

/** The datasources by the name ONCELY_TEST_DATASOURCE takes. */
export const datasources: Record<string, OpenDatasource> = {
  'node-postgres': nodePostgresUnderTest as OpenDatasource,
  'postgres-js': postgresJsUnderTest as OpenDatasource,
  'drizzle-node-postgres': drizzleNodePostgresUnderTest,
  'drizzle-postgres-js': drizzlePostgresJsUnderTest,
  kysely: kyselyUnderTest as OpenDatasource,
  knex: knexUnderTest as OpenDatasource,
  typeorm: typeormUnderTest as OpenDatasource,
  prisma: prismaUnderTest as OpenDatasource,
  pglite: pgliteUnderTest as OpenDatasource,
}

/**
 * The datasources of a single connection (`Database.oneConnection`): the contract suite leaves out the cases that
 * need a second connection or a second process on the same database, each saying why.
 */
export const oneConnection: ReadonlySet<string> = new Set(['pglite'])

/** The datasource this run of the suite tests. */
export const datasourceName = process.env.ONCELY_TEST_DATASOURCE ?? 'node-postgres'

export function openDatasource(url: string): Promise<DatasourceUnderTest> {
  const open = datasources[datasourceName]
  if (!open) throw new Error(`Unknown ONCELY_TEST_DATASOURCE ${JSON.stringify(datasourceName)}.`)
  return open(url)
}
