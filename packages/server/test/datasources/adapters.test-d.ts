// Type tests (checked by `pnpm typecheck`): every HTTP adapter built from a factory (Express, Fetch, Koa) infers the
// transaction type from the engine it is given, so a route's `tx` is the datasource's own transaction, typed as its
// library types it, without a cast; a use that library does not have does not compile. Fastify's `tx` is named once
// per program (`Register`): test/datasources/fastify/ holds it per library, each in a program of its own.
import type { PGlite, Transaction as PGliteTransaction } from '@electric-sql/pglite'
import type { ExtractTablesWithRelations } from 'drizzle-orm'
import { drizzle as drizzleNodePostgres, type NodePgQueryResultHKT } from 'drizzle-orm/node-postgres'
import { integer, type PgTransaction, pgTable, text } from 'drizzle-orm/pg-core'
import Fastify from 'fastify'
import type { Knex } from 'knex'
import type { Middleware } from 'koa'
import type { Generated, Kysely, Transaction } from 'kysely'
import type pg from 'pg'
import type { Sql, TransactionSql } from 'postgres'
import type { DataSource, EntityManager } from 'typeorm'
import { expectTypeOf, test } from 'vitest'
import { drizzle } from '../../src/drizzle/index.js'
import { type ExpressIdempotent, idempotency as expressIdempotency } from '../../src/express/index.js'
import { fastifyIdempotency } from '../../src/fastify/index.js'
import { type FetchIdempotent, idempotency as fetchIdempotency } from '../../src/fetch/index.js'
import { createEngine, type Engine, type ExecutionContext, postgresStore } from '../../src/index.js'
import { knexDatabase } from '../../src/knex/index.js'
import { type KoaIdempotencyState, idempotency as koaIdempotency } from '../../src/koa/index.js'
import { kyselyDatabase } from '../../src/kysely/index.js'
import { pglite } from '../../src/pglite/index.js'
import { postgresJs } from '../../src/postgres-js/index.js'
import { type PrismaTransaction, prismaDatabase } from '../../src/prisma/index.js'
import { typeormDatabase } from '../../src/typeorm/index.js'
import type { PrismaClient } from './prisma/generated/client.js'

const tenant = () => 'tenant'
// Nothing here runs: the values stand for what an application has.
declare const pool: pg.Pool

/**
 * Koa's middleware state for the routes of `engine`: the router names it (`router.post<KoaIdempotencyState<...>>`),
 * so what is held is that the middleware's state carries `engine`'s transaction, and `null` on an optional route.
 */
function koaStateOf<Tx>(engine: Engine<Tx>) {
  const idempotent = koaIdempotency({ engine, tenant })
  expectTypeOf(idempotent()).toEqualTypeOf<Middleware<KoaIdempotencyState<ExecutionContext<Tx>>>>()
  expectTypeOf(idempotent({ required: false })).toEqualTypeOf<
    Middleware<KoaIdempotencyState<ExecutionContext<Tx> | null>>
  >()
}

test('node-postgres, unchanged: pg.PoolClient, in every adapter', () => {
  const engine = createEngine({ store: postgresStore({ pool }) })
  const express = expressIdempotency({ engine, tenant })
  const fetch = fetchIdempotency({ engine, tenant })
  koaStateOf(engine)
  // The types a node-postgres app names keep their meaning: their defaults are its transaction.
  expectTypeOf(express).toEqualTypeOf<ExpressIdempotent>()
  expectTypeOf(fetch).toEqualTypeOf<FetchIdempotent>()
  express(async (req, res) => {
    expectTypeOf(req.idempotency.tx).toEqualTypeOf<pg.PoolClient>()
    await req.idempotency.tx.query('INSERT INTO payments (amount) VALUES ($1)', [100])
    res.status(201).end()
  })
  fetch({ required: false }, async (_request, { idempotency }) => {
    expectTypeOf(idempotency).toEqualTypeOf<ExecutionContext<pg.PoolClient> | null>()
    // @ts-expect-error an optional route's context is null without a key
    await idempotency.tx.query('SELECT 1')
    return new Response()
  })
  // Fastify's default, with no `Register`: node-postgres's transaction.
  const app = Fastify()
  void app.register(fastifyIdempotency, { engine, tenant })
  app.post('/v1/payments', { config: { idempotency: true } }, async (request) => {
    expectTypeOf(request.idempotency.tx).toEqualTypeOf<pg.PoolClient>()
    return {}
  })
})

const payments = pgTable('payments', { cart: text('cart').notNull(), amount: integer('amount').notNull() })
const schema = { payments }

test('Drizzle over node-postgres: its PgTransaction, with the schema', () => {
  const db = drizzleNodePostgres(pool, { schema })
  type Tx = PgTransaction<NodePgQueryResultHKT, typeof schema, ExtractTablesWithRelations<typeof schema>>
  const engine = createEngine({ store: postgresStore({ database: drizzle({ db }) }) })
  const express = expressIdempotency({ engine, tenant })
  const fetch = fetchIdempotency({ engine, tenant })
  koaStateOf(engine)
  express(async (req, res) => {
    expectTypeOf(req.idempotency.tx).toEqualTypeOf<Tx>()
    await req.idempotency.tx.insert(payments).values({ cart: 'c', amount: 100 })
    // @ts-expect-error a column the schema does not have
    await req.idempotency.tx.insert(payments).values({ cart: 'c', amount: 100, nope: 1 })
    res.status(201).end()
  })
  fetch(async (_request, { idempotency }) => {
    expectTypeOf(idempotency.tx).toEqualTypeOf<Tx>()
    await idempotency.tx.query.payments.findFirst()
    // @ts-expect-error Drizzle's `query` is its relational API, not node-postgres's query(text)
    await idempotency.tx.query('SELECT 1')
    return new Response()
  })
})

interface DB {
  payments: { id: Generated<string>; cart: string; amount: number }
}

test('Kysely: Transaction<DB>', () => {
  const db = {} as Kysely<DB>
  const engine = createEngine({ store: postgresStore({ database: kyselyDatabase({ db, pool }) }) })
  const express = expressIdempotency({ engine, tenant })
  const fetch = fetchIdempotency({ engine, tenant })
  koaStateOf(engine)
  express(async (req, res) => {
    expectTypeOf(req.idempotency.tx).toEqualTypeOf<Transaction<DB>>()
    await req.idempotency.tx.insertInto('payments').values({ cart: 'c', amount: 100 }).execute()
    // @ts-expect-error Kysely's transaction has no query(text, values)
    await req.idempotency.tx.query('SELECT 1')
    res.status(201).end()
  })
  fetch(async (_request, { idempotency }) => {
    expectTypeOf(idempotency.tx).toEqualTypeOf<Transaction<DB>>()
    // @ts-expect-error no such table
    await idempotency.tx.insertInto('refunds').values({}).execute()
    return new Response()
  })
})

test('Knex: Knex.Transaction', () => {
  const knex = {} as Knex
  const engine = createEngine({ store: postgresStore({ database: knexDatabase({ knex }) }) })
  const express = expressIdempotency({ engine, tenant })
  const fetch = fetchIdempotency({ engine, tenant })
  koaStateOf(engine)
  express(async (req, res) => {
    expectTypeOf(req.idempotency.tx).toEqualTypeOf<Knex.Transaction>()
    await req.idempotency.tx('payments').insert({ cart: 'c', amount: 100 })
    res.status(201).end()
  })
  fetch(async (_request, { idempotency }) => {
    expectTypeOf(idempotency.tx).toEqualTypeOf<Knex.Transaction>()
    // @ts-expect-error Knex's transaction is not Kysely's
    idempotency.tx.insertInto('payments')
    return new Response()
  })
})

test('TypeORM: EntityManager', () => {
  const dataSource = {} as DataSource
  const engine = createEngine({ store: postgresStore({ database: typeormDatabase({ dataSource }) }) })
  const express = expressIdempotency({ engine, tenant })
  const fetch = fetchIdempotency({ engine, tenant })
  koaStateOf(engine)
  express(async (req, res) => {
    expectTypeOf(req.idempotency.tx).toEqualTypeOf<EntityManager>()
    await req.idempotency.tx.query('INSERT INTO payments (cart, amount) VALUES ($1, $2)', ['c', 100])
    res.status(201).end()
  })
  fetch(async (_request, { idempotency }) => {
    expectTypeOf(idempotency.tx).toEqualTypeOf<EntityManager>()
    // @ts-expect-error an EntityManager is not a Kysely transaction
    idempotency.tx.insertInto('payments')
    return new Response()
  })
})

test("Prisma: the interactive-transaction client of the app's PrismaClient", () => {
  const prisma = {} as PrismaClient
  const engine = createEngine({
    store: postgresStore({ database: prismaDatabase({ prisma, side: prisma }) }),
  })
  const express = expressIdempotency({ engine, tenant })
  const fetch = fetchIdempotency({ engine, tenant })
  koaStateOf(engine)
  express(async (req, res) => {
    expectTypeOf(req.idempotency.tx).toEqualTypeOf<PrismaTransaction<PrismaClient>>()
    await req.idempotency.tx.payment.create({ data: { tenant: 't', cart: 'c', amount: 100 } })
    res.status(201).end()
  })
  fetch(async (_request, { idempotency }) => {
    expectTypeOf(idempotency.tx).toEqualTypeOf<PrismaTransaction<PrismaClient>>()
    // @ts-expect-error a model the schema does not have
    await idempotency.tx.refund.create({ data: {} })
    return new Response()
  })
})

test('postgres.js: TransactionSql', () => {
  const sql = {} as Sql
  const engine = createEngine({ store: postgresStore({ database: postgresJs({ sql }) }) })
  const express = expressIdempotency({ engine, tenant })
  const fetch = fetchIdempotency({ engine, tenant })
  koaStateOf(engine)
  express(async (req, res) => {
    expectTypeOf(req.idempotency.tx).toEqualTypeOf<TransactionSql>()
    await req.idempotency.tx`INSERT INTO payments (cart) VALUES (${'c'})`
    res.status(201).end()
  })
  fetch(async (_request, { idempotency }) => {
    expectTypeOf(idempotency.tx).toEqualTypeOf<TransactionSql>()
    // @ts-expect-error postgres.js runs tagged templates, not node-postgres's query(text, values)
    await idempotency.tx.query('SELECT 1', [])
    return new Response()
  })
})

test("PGlite: PGlite's Transaction", () => {
  const db = {} as PGlite
  const engine = createEngine({ store: postgresStore({ database: pglite({ db }) }) })
  const express = expressIdempotency({ engine, tenant })
  const fetch = fetchIdempotency({ engine, tenant })
  koaStateOf(engine)
  express(async (req, res) => {
    expectTypeOf(req.idempotency.tx).toEqualTypeOf<PGliteTransaction>()
    await req.idempotency.tx.query('INSERT INTO payments (cart) VALUES ($1)', ['c'])
    res.status(201).end()
  })
  fetch(async (_request, { idempotency }) => {
    expectTypeOf(idempotency.tx).toEqualTypeOf<PGliteTransaction>()
    // @ts-expect-error PGlite's transaction is not a Kysely one
    idempotency.tx.insertInto('payments')
    return new Response()
  })
})

test("an engine over another datasource is refused where an adapter is typed for node-postgres's", () => {
  const knex = createEngine({ store: postgresStore({ database: knexDatabase({ knex: {} as Knex }) }) })
  // @ts-expect-error Fastify's transaction type is node-postgres's until `Register` names another
  void Fastify().register(fastifyIdempotency, { engine: knex, tenant })
  // @ts-expect-error the Express wrapper given for node-postgres cannot take Knex's engine
  expressIdempotency<pg.PoolClient>({ engine: knex, tenant })
})
