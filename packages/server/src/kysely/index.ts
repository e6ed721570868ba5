export type { KyselyOptions } from '../datasources/kysely.js'
export { kyselyDatabase } from '../datasources/kysely.js'
