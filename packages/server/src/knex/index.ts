export type { KnexOptions } from '../datasources/knex.js'
export { knexDatabase } from '../datasources/knex.js'
