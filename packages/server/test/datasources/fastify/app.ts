// What every program here holds of a Fastify app, once its file named the datasource's transaction in `Register`:
// the plugin takes an engine over that datasource (and refuses node-postgres's), and an idempotent route's
// `request.idempotency.tx` is the registered type (`null` allowed only on an optional route). Nothing here runs.
import Fastify from 'fastify'
import type pg from 'pg'
import { expectTypeOf } from 'vitest'
import {
  type FastifyIdempotencyContext,
  fastifyIdempotency,
  type RegisteredTx,
} from '../../../src/fastify/index.js'
import { createEngine, type Database, postgresStore } from '../../../src/index.js'

const tenant = () => 'tenant'

/** An app on `database`, whose payments route hands its `tx` to `use`, where the file uses it as its library types it. */
export function appOn(database: Database<RegisteredTx>, use: (tx: RegisteredTx) => Promise<unknown>): void {
  const app = Fastify()
  void app.register(fastifyIdempotency, {
    engine: createEngine({ store: postgresStore({ database }) }),
    tenant,
  })
  app.post('/v1/payments', { config: { idempotency: true } }, async (request) => {
    expectTypeOf(request.idempotency.tx).toEqualTypeOf<RegisteredTx>()
    await use(request.idempotency.tx)
    return {}
  })
  app.post('/v1/notes', { config: { idempotency: { required: false } } }, async (request) => {
    expectTypeOf(request.idempotency).toEqualTypeOf<FastifyIdempotencyContext | null>()
    return {}
  })
  const nodePostgres = createEngine({ store: postgresStore({ pool: {} as pg.Pool }) })
  // @ts-expect-error an engine over another datasource (node-postgres's) than the registered one
  void app.register(fastifyIdempotency, { engine: nodePostgres, tenant })
}
