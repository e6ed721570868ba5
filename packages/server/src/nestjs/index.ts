export type { ExecutionContext } from '../engine/types.js'
export type { AdapterLogger, FingerprintOptions, IdempotencyRouteOptions } from '../http/options.js'
export { IdempotencyInterceptor } from './interceptor.js'
export { IdempotencyContext, IdempotencyTx, Idempotent, OncelyModule } from './module.js'
export {
  ONCELY_ENGINE,
  ONCELY_OPTIONS,
  type OncelyModuleAsyncOptions,
  type OncelyModuleOptions,
} from './options.js'
