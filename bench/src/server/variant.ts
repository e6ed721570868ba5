import type { FastifyInstance } from 'fastify'
import type pg from 'pg'

/** What a variant gets to build its routes: the shared pool on the bench database and the Redis address. */
export interface VariantContext {
  pool: pg.Pool
  redisUrl: string
}

/**
 * One way of serving `POST /ledger`, registered under its own prefix. `setup` registers routes on an encapsulated
 * Fastify scope and returns a function that closes what it opened (Redis clients and the like).
 */
export interface Variant {
  name: string
  /** What it stores keys in and what it guarantees, for the report. */
  description: string
  setup(scope: FastifyInstance, context: VariantContext): Promise<() => Promise<void>>
}
