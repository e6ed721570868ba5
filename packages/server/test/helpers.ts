import { requestFingerprint } from '@oncely/protocol'
import {
  type CitusTestDatabase,
  createCitusTestDatabase,
  createTestDatabase,
  type TestDatabase,
  waitFor,
} from '@oncely/test-support'
import pg from 'pg'
import { inject } from 'vitest'
import {
  distribute,
  type Engine,
  type EngineEvent,
  type ExecuteInput,
  type ExecutionContext,
  type HandlerResponse,
  migrate,
  postgresStore,
} from '../src/index.js'
import { createEngineForTesting, type TestingEngineOptions } from '../src/testing/index.js'

/**
 * The reservation protocol this run of the suite tests: vitest.config.ts runs every test file once per protocol,
 * so every engine the tests build (through {@link engineFor}) uses it unless a test names another.
 */
export const reservation: 'row' | 'lock' = process.env.ONCELY_TEST_RESERVATION === 'row' ? 'row' : 'lock'

/**
 * True when this run reaches Postgres through PgBouncer in transaction mode (vitest.config.ts): the pools of
 * {@link setupDatabase} then connect through it, and the engines of {@link engineFor} send unnamed statements, as
 * the server README tells users behind such a pooler to configure them.
 */
export const pooled = process.env.ONCELY_TEST_POOLER === 'pgbouncer'

/**
 * True when this run is on a Citus cluster (vitest.config.ts): {@link setupDatabase} then creates its database there,
 * with the key table, the outbox and the business tables distributed by tenant and co-located.
 */
export const onCitus = process.env.ONCELY_TEST_CITUS === '1'

/**
 * A fresh database with the oncely table, a `payments` business table with no unique constraint (so a duplicate
 * execution shows up as a second row instead of being masked), and `orders` with a natural key for the backstop.
 */
export async function setupDatabase(label: string, poolOptions: pg.PoolConfig = {}): Promise<TestDatabase> {
  if (onCitus) return setupCitusDatabase(label, poolOptions)
  const direct = await createTestDatabase(label, { max: 20, ...poolOptions })
  let db = direct
  if (pooled) {
    const url = new URL(direct.url)
    url.port = String(inject('pgbouncerPort'))
    url.hostname = '127.0.0.1'
    const pool = new pg.Pool({ connectionString: url.toString(), max: 20, ...poolOptions })
    pool.on('error', () => {})
    db = {
      ...direct,
      url: url.toString(),
      pool,
      async drop() {
        await pool.end().catch(() => {})
        await direct.drop()
      },
    }
  }
  await migrate(db.pool)
  await db.pool.query(`CREATE TABLE payments (
    id bigserial PRIMARY KEY, tenant text NOT NULL, cart text NOT NULL, amount integer NOT NULL)`)
  await db.pool.query(`CREATE TABLE orders (
    id bigserial PRIMARY KEY, tenant text NOT NULL, cart text NOT NULL,
    CONSTRAINT orders_cart_key UNIQUE (tenant, cart))`)
  return db
}

/**
 * {@link setupDatabase} on the Citus cluster (the run's, or the one whose coordinator `cluster` names): the same tables, with the tenant in the business tables' keys (a
 * distributed table's unique keys must contain its distribution column), distributed by tenant in few shards (4, two
 * per worker: enough to spread tenants over both workers, few enough to create quickly), and the key table and the
 * outbox co-located with them by distribute().
 */
export async function setupCitusDatabase(
  label: string,
  poolOptions: pg.PoolConfig = {},
  cluster: string = inject('citusUrl'),
): Promise<CitusTestDatabase> {
  const db = await createCitusTestDatabase(label, { cluster, pool: { max: 20, ...poolOptions } })
  await migrate(db.pool)
  await db.pool.query(`CREATE TABLE payments (
    id bigserial, tenant text NOT NULL, cart text NOT NULL, amount integer NOT NULL, PRIMARY KEY (tenant, id))`)
  await db.pool.query(`CREATE TABLE orders (
    id bigserial, tenant text NOT NULL, cart text NOT NULL, PRIMARY KEY (tenant, id),
    CONSTRAINT orders_cart_key UNIQUE (tenant, cart))`)
  await db.pool.query("SELECT create_distributed_table('payments', 'tenant', shard_count => 4)")
  await db.pool.query("SELECT create_distributed_table('orders', 'tenant', colocate_with => 'payments')")
  await distribute(db.pool, { colocateWith: 'payments' })
  return db
}

/** An engine on the database, under this run's protocol, that records its events (and may inject faults). */
export function engineFor(pool: pg.Pool, options: Partial<TestingEngineOptions> = {}) {
  const events: EngineEvent[] = []
  const engine = createEngineForTesting({
    store: postgresStore({ pool, preparedStatements: !pooled }),
    reservation,
    onEvent: (event) => events.push(event),
    ...options,
  })
  return { engine, events }
}

export const fingerprintOf = (body: unknown) =>
  requestFingerprint({ method: 'POST', route: '/v1/payments', body })

/** How many payments were booked for one cart: the effect of the key under test, so a duplicate fails a test. */
export async function paymentsFor(pool: pg.Pool, cart: string): Promise<number> {
  const result = await pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [cart])
  return result.rows[0].n
}

export async function countPayments(pool: pg.Pool, tenant?: string): Promise<number> {
  const result = tenant
    ? await pool.query('SELECT count(*)::int AS n FROM payments WHERE tenant = $1', [tenant])
    : await pool.query('SELECT count(*)::int AS n FROM payments')
  return result.rows[0].n
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/**
 * Waits until nothing holds the key of `input` and it has no record (`peek` answers null). An answer that does not
 * run the key (a replay read from the database, a mismatch, a 409) goes out before its transaction's ROLLBACK, so
 * under `reservation: 'lock'` the key's advisory lock outlives that answer by a moment: a request for the key right
 * after it was forgotten (or expired) can meet that lock and be answered in_progress, as a client would be, and
 * retry. A test that expects the very next request to run waits for this first.
 */
export async function keyFree<Tx>(engine: Engine<Tx>, input: ExecuteInput<Tx>): Promise<void> {
  await waitFor('the key to be free', async () => (await engine.peek(input)) === null, 5_000)
}

/**
 * Stops this process's event loop for `ms`, as a long GC pause, a blocking call or a starved CPU would: no timer
 * fires and no socket is read meanwhile. Unlike `await sleep(ms)`, which a live process does while it waits on a
 * provider (and during which the engine keeps its lease), this is a stall: the engine cannot renew anything.
 */
export function stallEventLoop(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms)
}

let counter = 0
/** A key no other test uses. */
export const freshKey = (label = 'k') =>
  `${label}-${process.pid}-${++counter}-${Math.random().toString(36).slice(2)}`

/** A handler that books one payment for `cart` in the idempotency transaction and answers 201 (with `body`). */
export function pay(cart: string, body?: unknown) {
  return async (ctx: ExecutionContext): Promise<HandlerResponse> => {
    const { rows } = await ctx.tx.query(
      'INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 100) RETURNING id',
      [ctx.scope, cart],
    )
    return {
      status: 201,
      headers: { location: `/v1/payments/${rows[0].id}` },
      body: body ?? { id: rows[0].id },
    }
  }
}

/** One request for `key` in `scope`, paying for the cart named after the key unless `extra` says otherwise. */
export const payRequest = (scope: string, key: string, extra: Partial<ExecuteInput> = {}): ExecuteInput => ({
  scope,
  operation: 'POST /v1/payments',
  key,
  fingerprint: fingerprintOf({ key }),
  handler: pay(key),
  ...extra,
})

/** A promise a test opens when it chooses. */
export function gate() {
  let open!: () => void
  const opened = new Promise<void>((resolve) => {
    open = resolve
  })
  return { opened, open }
}

/**
 * `handler`, and a promise that resolves once an attempt runs it, so holds its key. A test that sends a duplicate
 * while the first attempt runs waits on `started`, not on a fixed sleep, which a loaded machine can outlast.
 */
export function running<A extends unknown[], R>(
  handler: (...args: A) => R,
): { handler: (...args: A) => R; started: Promise<void> } {
  const started = gate()
  return {
    handler: (...args) => {
      started.open()
      return handler(...args)
    },
    started: started.opened,
  }
}

/** The key record of `key` (in the default table), or undefined. */
export async function keyRecord(pool: pg.Pool, key: string) {
  return (await pool.query('SELECT * FROM oncely.idempotency_keys WHERE key = $1', [key])).rows[0]
}
