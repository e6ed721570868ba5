export type { PrismaClientLike, PrismaOptions, PrismaTransaction } from '../datasources/prisma.js'
export { prismaDatabase } from '../datasources/prisma.js'
