export type { FingerprintOptions, IdempotencyRouteOptions } from '../http/options.js'
export type {
  FastifyIdempotencyContext,
  FastifyIdempotencyOf,
  FastifyIdempotencyOptions,
  Register,
  RegisteredTx,
} from './config.js'
export { fastifyIdempotency } from './plugin.js'
