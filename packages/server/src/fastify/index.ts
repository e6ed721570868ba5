export type { FingerprintConfig, IdempotencyPluginOptions, IdempotencyRouteConfig } from './config.js'
export { idempotency } from './plugin.js'
