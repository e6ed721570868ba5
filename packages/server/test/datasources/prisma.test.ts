// What the Prisma datasource adds to the contract suite (which runs under it as 'lock on prisma' and 'row on
// prisma'): `ctx.tx` typed as Prisma's interactive-transaction client of the generated PrismaClient, its options
// checked at construction, rows and row counts from Prisma's two raw methods, and Postgres's SQLSTATE back as `code`
// from Prisma's P2010/P2034 errors, on a real Postgres through @prisma/adapter-pg.
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import { PrismaPg } from '@prisma/adapter-pg'
import { afterAll, beforeAll, describe, expect, expectTypeOf, it } from 'vitest'
import { createEngine, insertOrExisting, migrate, postgresStore } from '../../src/index.js'
import { type PrismaTransaction, prismaDatabase } from '../../src/prisma/index.js'
import { freshKey } from '../helpers.js'
import { type Prisma, PrismaClient } from './prisma/generated/client.js'

let db: TestDatabase
let prisma: PrismaClient
let side: PrismaClient
beforeAll(async () => {
  db = await createTestDatabase('datasource_prisma_unit')
  await db.pool.query(
    'CREATE TABLE payments (id bigserial PRIMARY KEY, tenant text NOT NULL, cart text NOT NULL UNIQUE, amount integer NOT NULL)',
  )
  prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: db.url, max: 4 }) })
  side = new PrismaClient({ adapter: new PrismaPg({ connectionString: db.url, max: 2 }) })
})
afterAll(async () => {
  await Promise.all([prisma?.$disconnect(), side?.$disconnect()])
  await db?.drop()
})

const raise = (code: string) => ({
  text: `DO $$ BEGIN RAISE EXCEPTION 'raised %', '${code}' USING ERRCODE = '${code}'; END $$`,
  values: [],
})

describe('prismaDatabase', () => {
  it("types ctx.tx as Prisma's interactive-transaction client of your PrismaClient", () => {
    const database = prismaDatabase({ prisma, side })
    const engine = createEngine({ store: postgresStore({ database }) })
    expectTypeOf(database.execute).parameter(0).toEqualTypeOf<Prisma.TransactionClient>()
    expectTypeOf<PrismaTransaction<PrismaClient>>().toEqualTypeOf<Prisma.TransactionClient>()
    void engine.execute({
      scope: 't',
      operation: 'POST /payments',
      key: freshKey(),
      fingerprint: 'f',
      handler: async (ctx) => {
        expectTypeOf(ctx.tx).toEqualTypeOf<Prisma.TransactionClient>()
        expectTypeOf(ctx.tx.payment.create).toBeFunction()
        // What $transaction(async (tx) => ...) hands its callback.
        type Callback = Extract<Parameters<PrismaClient['$transaction']>[0], (tx: never) => unknown>
        expectTypeOf(ctx.tx).toEqualTypeOf<Parameters<Callback>[0]>()
        return { status: 200 }
      },
    })
  })

  it('types ctx.tx from a client extended with $extends too', () => {
    const extended = prisma.$extends({ model: { payment: { total: () => 0 } } })
    const database = prismaDatabase({ prisma: extended, side })
    type Callback = Extract<Parameters<(typeof extended)['$transaction']>[0], (tx: never) => unknown>
    expectTypeOf(database.execute).parameter(0).toEqualTypeOf<Parameters<Callback>[0]>()
    expectTypeOf(database.execute).parameter(0).toHaveProperty('payment').toHaveProperty('total')
  })

  it('checks its options at construction, naming the bad one', () => {
    expect(() => prismaDatabase(undefined as never)).toThrow(
      'Expected the options of prismaDatabase() to be an object.',
    )
    expect(() => prismaDatabase({ prisma: {} as never, side })).toThrow('`prisma` to be a PrismaClient')
    expect(() => prismaDatabase({ prisma, side: undefined as never })).toThrow('`side` to be a PrismaClient')
    expect(() => prismaDatabase({ prisma, side: prisma })).toThrow('`side` to be a PrismaClient other than')
  })

  it('migrates the key table through Prisma', async () => {
    const database = prismaDatabase({ prisma, side })
    expect((await migrate(database)).applied.length).toBeGreaterThan(0)
    expect(await migrate(database)).toEqual({ applied: [] })
    const { rows } = await db.pool.query(
      "SELECT to_regclass('oncely.idempotency_keys') IS NOT NULL AS present",
    )
    expect(rows[0].present).toBe(true)
  })

  it('reads rows with their count, and counts the rows a write without RETURNING touched', async () => {
    const database = prismaDatabase({ prisma, side })
    const cart = freshKey()
    const inserted = await database.query({
      text: "INSERT INTO payments (tenant, cart, amount) VALUES ('t', $1, 5) RETURNING id, $2::bytea AS body",
      values: [cart, Buffer.from('hi')],
    })
    expect(inserted.rowCount).toBe(1)
    // As node-postgres reads them: int8 as a string, bytea as a Buffer.
    expect(typeof inserted.rows[0]?.id).toBe('string')
    expect(Buffer.isBuffer(inserted.rows[0]?.body)).toBe(true)
    expect(String(inserted.rows[0]?.body)).toBe('hi')
    const updated = await database.side({
      text: 'UPDATE payments SET amount = 6 WHERE cart = $1',
      values: [cart],
    })
    expect(updated).toEqual({ rows: [], rowCount: 1 })
    const read = await database.transaction((tx) =>
      database.execute(tx, {
        text: '-- a comment first\n  (SELECT amount FROM payments WHERE cart = $1)',
        values: [cart],
      }),
    )
    expect(read).toEqual({ rows: [{ amount: 6 }], rowCount: 1 })
    const deleted = await database.query({ text: 'DELETE FROM payments WHERE cart = $1', values: [cart] })
    expect(deleted.rowCount).toBe(1)
  })

  it("gives Postgres's SQLSTATE as `code` on the client, the side lane and in a transaction", async () => {
    const database = prismaDatabase({ prisma, side })
    for (const code of ['40001', '40P01', '55P03', '25P03', '57P01']) {
      await expect(database.query(raise(code))).rejects.toMatchObject({ code, message: `raised ${code}` })
      await expect(database.side(raise(code))).rejects.toMatchObject({ code })
      await expect(database.transaction((tx) => database.execute(tx, raise(code)))).rejects.toMatchObject({
        code,
      })
    }
    // Prisma's own error stays as the cause.
    const error = await database.query(raise('40001')).catch((e: unknown) => e)
    expect((error as Error).cause).toMatchObject({ name: 'PrismaClientKnownRequestError', code: 'P2010' })
  })

  it('names the constraint of a unique violation, as node-postgres does', async () => {
    const database = prismaDatabase({ prisma, side })
    const cart = freshKey()
    const insert = { text: "INSERT INTO payments (tenant, cart, amount) VALUES ('t', $1, 1)", values: [cart] }
    await database.query(insert)
    await expect(database.query(insert)).rejects.toMatchObject({
      code: '23505',
      constraint: 'payments_cart_key',
    })
  })

  it("insertOrExisting reads the unique violation of a model write from Prisma's P2002", async () => {
    const database = prismaDatabase({ prisma, side })
    await migrate(database)
    const engine = createEngine({ store: postgresStore({ database }), replayCache: false })
    const cart = freshKey()
    const order = (key: string) =>
      engine.execute({
        scope: 't',
        operation: 'POST /payments',
        key,
        fingerprint: 'f',
        handler: async (ctx) => {
          const { created, value } = await insertOrExisting(ctx.tx, {
            constraint: 'payments_cart_key',
            database,
            insert: (tx) => tx.payment.create({ data: { tenant: 't', cart, amount: 1 } }),
            existing: (tx) => tx.payment.findUniqueOrThrow({ where: { cart } }),
          })
          return { status: created ? 201 : 200, body: { id: String(value.id) } }
        },
      })
    const first = await order(freshKey())
    const second = await order(freshKey())
    expect(first).toMatchObject({ kind: 'executed', response: { status: 201 } })
    expect(second).toMatchObject({ kind: 'executed', response: { status: 200 } })
    expect(await prisma.payment.count({ where: { cart } })).toBe(1)
  })

  it('a lock wait past lock_timeout is 55P03, from a real row lock', async () => {
    const database = prismaDatabase({ prisma, side })
    const cart = freshKey()
    await database.query({
      text: "INSERT INTO payments (tenant, cart, amount) VALUES ('t', $1, 1)",
      values: [cart],
    })
    let release!: () => void
    let locked!: () => void
    const holding = new Promise<void>((resolve) => {
      locked = resolve
    })
    const holder = database.transaction(async (tx) => {
      await database.execute(tx, {
        text: 'SELECT 1 FROM payments WHERE cart = $1 FOR UPDATE',
        values: [cart],
      })
      locked()
      await new Promise<void>((resolve) => {
        release = resolve
      })
    })
    await holding
    const waiter = database.transaction(async (tx) => {
      await database.execute(tx, { text: "SET LOCAL lock_timeout = '50ms'", values: [] })
      await database.execute(tx, { text: 'UPDATE payments SET amount = 2 WHERE cart = $1', values: [cart] })
    })
    await expect(waiter).rejects.toMatchObject({ code: '55P03' })
    release()
    await holder
  })

  it("knows Prisma's transaction client from the client itself", async () => {
    const database = prismaDatabase({ prisma, side })
    expect(database.isTransaction(prisma)).toBe(false)
    expect(database.isTransaction({})).toBe(false)
    await database.transaction(async (tx) => {
      expect(database.isTransaction(tx)).toBe(true)
    })
  })
})
