export type { PGliteOptions } from '../datasources/pglite.js'
export { pglite } from '../datasources/pglite.js'
