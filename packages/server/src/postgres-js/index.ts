export type { PostgresJsOptions } from '../datasources/postgres-js.js'
export { postgresJs } from '../datasources/postgres-js.js'
