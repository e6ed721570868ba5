export { isRedisTimeoutError, RedisTimeoutError } from '../errors/redis-timeout-error.js'
export type { SoftLeaseOptions } from './soft-lease.js'
export { withSoftLease } from './soft-lease.js'
