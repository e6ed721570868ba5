// The Prisma datasource: the seam (store/database.ts) over a PrismaClient (Prisma 7, with a Postgres driver adapter
// such as @prisma/adapter-pg), by way of callbackDatabase. The handler's transaction is Prisma's interactive-
// transaction client, the `tx` of `prisma.$transaction(async (tx) => ...)`, typed from your own PrismaClient.
//
// Prisma runs raw SQL two ways and neither answers both rows and a row count: `$queryRawUnsafe` returns the rows,
// `$executeRawUnsafe` the count. A statement that returns rows (a SELECT, VALUES, a WITH ending in one, anything
// with RETURNING) goes through the first, its row count being its rows; any other (UPDATE, DELETE, SET...) through
// the second. Prisma wraps a database error as P2010 (or P2034 for a write conflict); the SQLSTATE is kept in the
// driver adapter's error under `meta.driverAdapterError.cause`, from where it is put back as `code`.
// Prisma cannot read a column of type void (`SELECT pg_notify(...)`): oncely's statements cast such calls to text.
// A transaction Postgres ended for sitting idle past the lease (25P03) reaches Prisma as a broken connection without
// its SQLSTATE (node-postgres tells it to the connection's listeners, which the driver adapter keeps): the engine
// recognizes the lost lease by the time since it last kept it.
import type { ITXClientDenyList } from '@prisma/client/runtime/client'
import { objectOptions } from '../options/check.js'
import type { Database, Rows, Statement } from '../store/database.js'
import { callbackDatabase } from './callback-database.js'

/** What oncely uses of a PrismaClient (or of a client extended with `$extends`). */
export interface PrismaClientLike {
  $transaction(...args: never[]): Promise<unknown>
  $queryRawUnsafe(query: string, ...values: never[]): PromiseLike<unknown>
  $executeRawUnsafe(query: string, ...values: never[]): PromiseLike<number>
}

/** Prisma's interactive-transaction client of `Client`: what `prisma.$transaction(async (tx) => ...)` hands `tx`. */
export type PrismaTransaction<Client extends PrismaClientLike> = Omit<Client, ITXClientDenyList>

/** Options of {@link prismaDatabase}. */
export interface PrismaOptions<Client extends PrismaClientLike> {
  /**
   * Your PrismaClient (Prisma 7, with a Postgres driver adapter), on the database that holds your business tables
   * too. oncely never disconnects it. Its transactions run without Prisma's interactive-transaction timeout
   * (`transactionOptions.timeout`, 5 s by default): the engine's lease bounds them instead, so a live handler keeps
   * its transaction however long it waits. `transactionOptions.maxWait` (how long a transaction waits for a
   * connection) still applies.
   */
  prisma: Client
  /**
   * A second PrismaClient on the same database with a pool of its own of one or two connections, which oncely never
   * disconnects: the side lane, where a renewed lease or a recovery point commits while every attempt in flight may
   * hold a connection of `prisma` (on `prisma` itself such a statement could wait for a connection forever). A
   * driver adapter does not show its pool, so oncely cannot open this one for you.
   * @example
   * prismaDatabase({ prisma, side: new PrismaClient({ adapter: new PrismaPg({ connectionString, max: 2 }) }) })
   */
  side: PrismaClientLike
}

/** The longest timer Node keeps (a longer one fires at once): Prisma's timeout, in effect none. */
const NO_TIMEOUT_MS = 2 ** 31 - 1

const isClient = (value: unknown): value is PrismaClientLike =>
  typeof (value as PrismaClientLike | undefined)?.$queryRawUnsafe === 'function' &&
  typeof (value as PrismaClientLike).$executeRawUnsafe === 'function' &&
  typeof (value as PrismaClientLike).$transaction === 'function'

/** A statement whose answer is rows: read with `$queryRawUnsafe`; any other is run with `$executeRawUnsafe`. */
const LEADING = /^(?:\s+|--[^\n]*\n|\/\*[\s\S]*?\*\/|\()*([A-Za-z]+)/
const READS = new Set(['select', 'values', 'table', 'with', 'show', 'explain', 'fetch'])
const returnsRows = (text: string) =>
  READS.has(LEADING.exec(text)?.[1]?.toLowerCase() ?? '') || /\bRETURNING\b/i.test(text)

/** A value as node-postgres reads it, which the rest of oncely expects: int8 as a string, bytea as a Buffer. */
function pgValue(value: unknown): unknown {
  if (typeof value === 'bigint') return value.toString()
  if (value instanceof Uint8Array && !Buffer.isBuffer(value))
    return Buffer.from(value.buffer, value.byteOffset, value.byteLength)
  return value
}

function pgRow(row: Record<string, unknown>): Record<string, unknown> {
  for (const column in row) row[column] = pgValue(row[column])
  return row
}

interface AdapterCause {
  originalCode?: unknown
  originalMessage?: unknown
  code?: unknown
  message?: unknown
  detail?: unknown
  constraint?: { index?: unknown } | unknown
}

/**
 * Prisma's error as Postgres reported it: an Error with the SQLSTATE as `code`, Postgres's message, the violated
 * constraint's name (as node-postgres gives them) and Prisma's own error as `cause`. Errors without a SQLSTATE (a
 * transaction Prisma already closed, a connection that could not be had) are left as Prisma threw them.
 */
function postgresError(error: unknown): unknown {
  const prismaError = error as {
    name?: unknown
    meta?: { driverAdapterError?: { cause?: AdapterCause } }
    cause?: AdapterCause
  } | null
  // A client error (P2010, P2034) carries the adapter's error in `meta`; the adapter's own error, thrown as it is
  // where no query was being run (opening or ending a transaction), carries it as `cause`.
  const cause =
    prismaError?.meta?.driverAdapterError?.cause ??
    (prismaError?.name === 'DriverAdapterError' ? prismaError.cause : undefined)
  const code = cause?.originalCode ?? cause?.code
  if (typeof code !== 'string' || !/^[0-9A-Z]{5}$/.test(code)) return error
  const message = cause?.originalMessage ?? cause?.message
  const mapped = new Error(typeof message === 'string' ? message : String(message), { cause: error })
  const constraint = (cause?.constraint as { index?: unknown } | undefined)?.index
  return Object.assign(mapped, {
    code,
    ...(typeof constraint === 'string' ? { constraint } : {}),
    ...(typeof cause?.detail === 'string' ? { detail: cause.detail } : {}),
  })
}

async function run(client: PrismaClientLike, statement: Statement): Promise<Rows> {
  const values = statement.values as never[]
  try {
    if (returnsRows(statement.text)) {
      const rows = (await client.$queryRawUnsafe(statement.text, ...values)) as Record<string, unknown>[]
      return { rows: rows.map(pgRow), rowCount: rows.length }
    }
    return { rows: [], rowCount: await client.$executeRawUnsafe(statement.text, ...values) }
  } catch (error) {
    throw postgresError(error)
  }
}

/**
 * The Prisma datasource: `ctx.tx` is Prisma's interactive-transaction client of your PrismaClient (the `tx` of
 * `prisma.$transaction(async (tx) => ...)`), so `ctx.tx.payment.create(...)` writes in the transaction that also
 * completes the key.
 *
 * @example
 * const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString }) })
 * const side = new PrismaClient({ adapter: new PrismaPg({ connectionString, max: 2 }) })
 * const engine = createEngine({ store: postgresStore({ database: prismaDatabase({ prisma, side }) }) })
 */
export function prismaDatabase<Client extends PrismaClientLike>(
  options: PrismaOptions<Client>,
): Database<PrismaTransaction<Client>> {
  objectOptions('prismaDatabase()', options)
  const { prisma, side } = options
  if (!isClient(prisma)) throw new TypeError('Expected `prisma` to be a PrismaClient.')
  if (!isClient(side))
    throw new TypeError(
      'Expected `side` to be a PrismaClient on the same database with a pool of its own (max 2 connections).',
    )
  if (side === prisma)
    throw new TypeError('Expected `side` to be a PrismaClient other than `prisma`, on a pool of its own.')
  type Tx = PrismaTransaction<Client>
  // The callback form of $transaction (the array form is an overload of the same method).
  const client = prisma as unknown as {
    $transaction<T>(work: (tx: Tx) => Promise<T>, options: { timeout: number }): Promise<T>
  }
  return callbackDatabase<Tx>({
    library: 'prisma',
    source: prisma,
    transaction: async (work) => {
      try {
        return await client.$transaction(work, { timeout: NO_TIMEOUT_MS })
      } catch (error) {
        throw postgresError(error)
      }
    },
    execute: (tx, statement) => run(tx as unknown as PrismaClientLike, statement),
    query: (statement) => run(prisma, statement),
    side: (statement) => run(side, statement),
    // An interactive-transaction client has the raw methods but not `$connect` or `$disconnect`.
    isTransaction: (tx): tx is Tx =>
      isClient(tx) && typeof (tx as { $disconnect?: unknown }).$disconnect !== 'function',
    // An error of a model query in your code (P2002, P2034...), as Postgres reported it: what insertOrExisting
    // reads a unique violation from.
    diagnose(error) {
      const mapped = postgresError(error)
      return mapped === error ? undefined : { error: mapped as Error, adapted: false }
    },
  })
}
