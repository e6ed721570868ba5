// Global setup of the test projects that run through PgBouncer (vitest.config.ts): one pooler in transaction mode
// for the whole run, its port handed to the test files (test/helpers.ts connects through it).
import { startPgBouncer } from '@oncely/test-support'
import type { TestProject } from 'vitest/node'

declare module 'vitest' {
  export interface ProvidedContext {
    pgbouncerPort: number
  }
}

export default async function setup(project: TestProject) {
  const bouncer = await startPgBouncer({ poolSize: 8 })
  project.provide('pgbouncerPort', bouncer.port)
  return () => bouncer.stop()
}
