import { Idempotency, IdempotencyError, IdempotencyErrorCodes } from '@node-idempotency/core'
import type { StorageAdapter } from '@node-idempotency/storage'
import { RedisStorageAdapter } from '@node-idempotency/storage-adapter-redis'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type pg from 'pg'
import { headerKey, recordTransfer, type Transfer } from './ledger.js'
import { NODE_IDEMPOTENCY_SCHEMA, PostgresStorageAdapter } from './pg-storage-adapter.js'
import type { Variant } from './variant.js'

/** Kept short so the bench leaves little behind in the shared Redis. */
const TTL_MS = 15 * 60_000

const STATUS: Record<IdempotencyErrorCodes, number> = {
  [IdempotencyErrorCodes.REQUEST_IN_PROGRESS]: 409,
  [IdempotencyErrorCodes.IDEMPOTENCY_FINGERPRINT_MISSMATCH]: 422,
  [IdempotencyErrorCodes.IDEMPOTENCY_KEY_MISSING]: 400,
  [IdempotencyErrorCodes.IDEMPOTENCY_KEY_LEN_EXEEDED]: 400,
}

/**
 * The library's documented core flow, as its own Fastify plugin does it: `onRequest` (claim or replay), the
 * business transaction, then `onResponse` (store the response) before answering, so a retry sees the result.
 */
function routes(scope: FastifyInstance, pool: pg.Pool, idempotency: Idempotency): void {
  scope.post<{ Body: Transfer }>(
    '/ledger',
    async (request: FastifyRequest<{ Body: Transfer }>, reply: FastifyReply) => {
      const call = {
        method: request.method,
        path: request.routeOptions.url ?? request.url,
        headers: request.headers as Record<string, unknown>,
        body: request.body as unknown as Record<string, unknown>,
        options: { enforceIdempotency: true, cacheTTLMS: TTL_MS },
      }
      try {
        const cached = await idempotency.onRequest(call)
        if (cached) {
          const status = (cached.additional?.status as number | undefined) ?? 200
          return reply.code(status).header('idempotent-replayed', 'true').send(cached.body)
        }
      } catch (error) {
        if (error instanceof IdempotencyError)
          return reply.code(STATUS[error.code]).send({ error: error.code })
        throw error
      }
      const response = await recordTransfer(pool, headerKey(request.headers['idempotency-key']), request.body)
      await idempotency.onResponse(call, { body: response.body, additional: { status: response.status } })
      return reply.code(response.status).send(response.body)
    },
  )
}

function variant(
  name: string,
  description: string,
  storage: (pool: pg.Pool, redisUrl: string) => Promise<StorageAdapter>,
): Variant {
  return {
    name,
    description,
    async setup(scope, { pool, redisUrl }) {
      const adapter = await storage(pool, redisUrl)
      routes(scope, pool, new Idempotency(adapter, { cacheKeyPrefix: `bench-${process.pid}` }))
      return async () => {
        await adapter.disconnect?.()
      }
    },
  }
}

export const nodeIdempotencyPostgres = variant(
  'node-idempotency-pg',
  '@node-idempotency/core 1.0.11, Postgres adapter (ported from its Redis one), outside the business transaction',
  async (pool) => {
    await pool.query(NODE_IDEMPOTENCY_SCHEMA)
    return new PostgresStorageAdapter(pool)
  },
)

export const nodeIdempotencyRedis = variant(
  'node-idempotency-redis',
  '@node-idempotency/core 1.0.11 + @node-idempotency/storage-adapter-redis 1.0.2',
  async (_pool, redisUrl) => {
    const adapter = new RedisStorageAdapter({ url: redisUrl })
    await adapter.connect()
    return adapter
  },
)
