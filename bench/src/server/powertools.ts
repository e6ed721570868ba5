import {
  IdempotencyAlreadyInProgressError,
  IdempotencyConfig,
  IdempotencyValidationError,
  makeIdempotent,
} from '@aws-lambda-powertools/idempotency'
import { CachePersistenceLayer } from '@aws-lambda-powertools/idempotency/cache'
import { createClient } from '@redis/client'
import { headerKey, type LedgerResponse, recordTransfer, type Transfer } from './ledger.js'
import type { Variant } from './variant.js'

/** The one member of a Lambda context that Powertools reads. */
interface LambdaLikeContext {
  getRemainingTimeInMillis(): number
}

interface LedgerEvent {
  key: string | undefined
  body: Transfer
}

/**
 * Outside Lambda, `makeIdempotent` needs a context only for `getRemainingTimeInMillis()`, which bounds how long an
 * in-progress record blocks other attempts. 30 s matches oncely's default lease.
 */
const fakeContext: LambdaLikeContext = { getRemainingTimeInMillis: () => 30_000 }

/**
 * AWS Powertools idempotency with its Redis (cache) persistence layer. The key is `eventKeyJmesPath: 'key'` (the
 * header) and only the handler's return value is stored. Payload validation stays off: with
 * `payloadValidationJmesPath` set, 2.35.0's CachePersistenceLayer drops the payload hash when it stores the result
 * (`_updateRecord` writes status, expiry and data only), so every replay fails with IdempotencyValidationError.
 */
export const powertools: Variant = {
  name: 'powertools-redis',
  description:
    '@aws-lambda-powertools/idempotency 2.35.0, CachePersistenceLayer on Redis via @redis/client 6',
  async setup(scope, { pool, redisUrl }) {
    const client = createClient({ url: redisUrl })
    client.on('error', () => {})
    await client.connect()
    const handle = makeIdempotent(
      async (event: LedgerEvent, _context: LambdaLikeContext): Promise<LedgerResponse> =>
        recordTransfer(pool, event.key, event.body),
      {
        persistenceStore: new CachePersistenceLayer({ client }),
        config: new IdempotencyConfig({
          eventKeyJmesPath: 'key',
          throwOnNoIdempotencyKey: true,
          expiresAfterSeconds: 15 * 60,
        }),
        keyPrefix: `bench-${process.pid}`,
      },
    )
    scope.post<{ Body: Transfer }>('/ledger', async (request, reply) => {
      try {
        const response = await handle(
          { key: headerKey(request.headers['idempotency-key']), body: request.body },
          fakeContext,
        )
        return reply.code(response.status).send(response.body)
      } catch (error) {
        if (error instanceof IdempotencyAlreadyInProgressError)
          return reply.code(409).send({ error: 'in_progress' })
        if (error instanceof IdempotencyValidationError)
          return reply.code(422).send({ error: 'payload_mismatch' })
        throw error
      }
    })
    return async () => {
      await client.quit()
    }
  },
}
