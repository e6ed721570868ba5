import { createHash } from 'node:crypto'
import { type Engine, migrate, postgresStore } from '@oncely/server'
import { fastifyIdempotency } from '@oncely/server/fastify'
import type { FastifyInstance } from 'fastify'
import type pg from 'pg'
import { benchEngine } from './engines.js'
import { insertEntry, type LedgerResponse, type Transfer } from './ledger.js'
import type { Variant } from './variant.js'

export const ONCELY_SCHEMA = 'oncely'

/** The business INSERT through one database library, in that library's transaction object. */
export type LedgerInsert<Tx> = (
  tx: Tx,
  key: string | undefined,
  transfer: Transfer,
) => Promise<LedgerResponse>

/**
 * The Fastify plugin on `engine` and the idempotent `POST /ledger` whose handler only runs the INSERT (through
 * node-postgres by default, or through the library the engine's datasource wraps).
 */
export async function ledgerRoute<Tx = pg.PoolClient>(
  scope: FastifyInstance,
  engine: Engine<Tx>,
  insert: LedgerInsert<Tx> = insertEntry as unknown as LedgerInsert<Tx>,
): Promise<void> {
  // The plugin's request.idempotency is typed for node-postgres; its tx is the datasource's transaction object.
  await scope.register(fastifyIdempotency, { engine: engine as unknown as Engine, tenant: () => 'bench' })
  scope.post<{ Body: Transfer }, { idempotency: { required: true } }>(
    '/ledger',
    { config: { idempotency: { required: true } } },
    async (request, reply) => {
      const { tx, key } = request.idempotency
      const response = await insert(tx as unknown as Tx, key, request.body)
      return reply.code(response.status).send(response.body)
    },
  )
}

/**
 * oncely: the key is reserved, the INSERT runs and the response is stored in one transaction on the business
 * database, with a fenced completion. The handler only runs the INSERT; the engine owns BEGIN and COMMIT.
 * `replayCache: false` makes every replay a lookup in the key table, which is what the scale runs must measure:
 * with the cache a replay of a key this process finished never reaches Postgres, whatever the table's size.
 */
// The protocol is required: with a default, the 'row' variants once measured the default protocol under its name.
function variant(name: string, replayCache: boolean, reservation: 'row' | 'lock'): Variant {
  return {
    name,
    description: `oncely engine + Fastify plugin, keys in the business Postgres, same transaction, reservation: '${reservation}'${replayCache ? '' : ', replay cache off'}`,
    async setup(scope, { pool }) {
      await migrate(pool, { schema: ONCELY_SCHEMA })
      const store = postgresStore({ pool, schema: ONCELY_SCHEMA })
      const engine = benchEngine(
        name,
        replayCache ? { store, reservation } : { store, reservation, replayCache: false },
      )
      await ledgerRoute(scope, engine)
      return async () => {}
    },
  }
}

/**
 * A reference, not a product: the engine called from a bare route (no plugin: the route takes the key and hashes the
 * body itself, like sql-floor). Between it and sql-floor is the engine's own cost; between it and oncely-lock, the
 * HTTP adapter's.
 */
export const oncelyEngineOnly: Variant = {
  name: 'engine-floor',
  description: "reference: the engine (reservation: 'lock') called from a bare route, no plugin",
  async setup(scope, { pool }) {
    await migrate(pool, { schema: 'oncely_engine' })
    const engine = benchEngine('engine-floor', {
      store: postgresStore({ pool, schema: 'oncely_engine' }),
      reservation: 'lock',
    })
    scope.post<{ Body: Transfer }>('/ledger', async (request, reply) => {
      const key = request.headers['idempotency-key']
      if (typeof key !== 'string') return reply.code(400).send({})
      const outcome = await engine.execute({
        scope: 'bench',
        operation: 'POST /ledger',
        key,
        fingerprint: createHash('sha256').update(JSON.stringify(request.body)).digest('hex'),
        handler: async (ctx) => insertEntry(ctx.tx, key, request.body),
      })
      if (outcome.kind === 'executed' || outcome.kind === 'replayed') {
        return reply
          .code(outcome.response.status)
          .headers(outcome.response.headers)
          .send(outcome.response.body)
      }
      return reply
        .code(outcome.kind === 'mismatch' ? 422 : outcome.kind === 'in_progress' ? 409 : 503)
        .send({})
    })
    return async () => {}
  },
}

export const oncelyRow = variant('oncely-row', true, 'row')
export const oncelyRowNoCache = variant('oncely-row-nocache', false, 'row')
export const oncelyLock = variant('oncely-lock', true, 'lock')
export const oncelyLockNoCache = variant('oncely-lock-nocache', false, 'lock')
