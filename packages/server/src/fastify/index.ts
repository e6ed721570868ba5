export type {
  FingerprintConfig,
  IdempotencyOf,
  IdempotencyPluginOptions,
  IdempotencyRouteConfig,
} from './config.js'
export { idempotency } from './plugin.js'
