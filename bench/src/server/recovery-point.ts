import { migrate, postgresStore } from '@oncely/server'
import { fastifyIdempotency } from '@oncely/server/fastify'
import { benchEngine } from './engines.js'
import { insertEntry, type Transfer } from './ledger.js'
import { ONCELY_SCHEMA } from './oncely.js'
import type { Variant } from './variant.js'

/**
 * `oncely-lock` with one recovery point saved before the INSERT, as a handler that calls a provider first would: under
 * 'lock' the first save writes the key's leased row in a transaction of its own, so this measures what a multi-step
 * handler pays over a single-step one.
 */
export const oncelyRecoveryPoint: Variant = {
  name: 'oncely-recovery-point',
  description:
    "oncely (reservation: 'lock'), Fastify plugin, ctx.saveRecoveryPoint('charged') before the INSERT",
  async setup(scope, { pool }) {
    await migrate(pool, { schema: ONCELY_SCHEMA })
    const engine = benchEngine('oncely-recovery-point', {
      store: postgresStore({ pool, schema: ONCELY_SCHEMA }),
      reservation: 'lock',
    })
    await scope.register(fastifyIdempotency, { engine, tenant: () => 'bench' })
    scope.post<{ Body: Transfer }, { idempotency: { required: true } }>(
      '/ledger',
      { config: { idempotency: { required: true } } },
      async (request, reply) => {
        const ctx = request.idempotency
        await ctx.saveRecoveryPoint('charged')
        const response = await insertEntry(ctx.tx, ctx.key, request.body)
        return reply.code(response.status).send(response.body)
      },
    )
    return async () => {}
  },
}
