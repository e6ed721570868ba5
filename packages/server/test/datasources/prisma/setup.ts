// Global setup: generates the Prisma client of schema.prisma into ./generated (not committed), which the Prisma
// datasource's tests import; a client already generated from the same schema and prisma version is kept.
import { execFileSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'

export default function setup(): void {
  const cwd = fileURLToPath(new URL('../../..', import.meta.url))
  execFileSync(
    process.execPath,
    [
      fileURLToPath(new URL('../../../../../scripts/prisma-generate.mjs', import.meta.url)),
      'test/datasources/prisma/schema.prisma',
    ],
    { cwd, stdio: 'inherit' },
  )
}
