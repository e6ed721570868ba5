import { headerKey, recordTransfer, type Transfer } from './ledger.js'
import type { Variant } from './variant.js'

/** No idempotency at all: the cost floor every other variant is divided by. */
export const baseline: Variant = {
  name: 'baseline',
  description: 'no idempotency layer: BEGIN; INSERT; COMMIT',
  async setup(scope, { pool }) {
    scope.post<{ Body: Transfer }>('/ledger', async (request, reply) => {
      const response = await recordTransfer(pool, headerKey(request.headers['idempotency-key']), request.body)
      return reply.code(response.status).send(response.body)
    })
    return async () => {}
  },
}
