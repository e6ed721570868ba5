export type { DrizzleOptions, DrizzleTransaction } from '../datasources/drizzle.js'
export { drizzle } from '../datasources/drizzle.js'
