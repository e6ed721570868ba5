export type { TypeormOptions } from '../datasources/typeorm.js'
export { typeormDatabase } from '../datasources/typeorm.js'
