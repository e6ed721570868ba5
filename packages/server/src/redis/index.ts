export type { SoftLeaseOptions } from './soft-lease.js'
export { withSoftLease } from './soft-lease.js'
