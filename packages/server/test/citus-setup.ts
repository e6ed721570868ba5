// Global setup of the test projects that run on a Citus cluster (vitest.config.ts): one coordinator and two workers
// for the whole run, the coordinator's URL handed to the test files (test/helpers.ts creates their databases there).
import { citusMissing, startCitusCluster } from '@oncely/test-support'
import type { TestProject } from 'vitest/node'

declare module 'vitest' {
  export interface ProvidedContext {
    citusUrl: string
  }
}

export default async function setup(project: TestProject) {
  const missing = citusMissing()
  if (missing) {
    throw new Error(
      `The tests on a Citus cluster cannot run: ${missing}. .ci/run builds Citus with ../shared/citus/build.sh; CI must run them.`,
    )
  }
  const cluster = await startCitusCluster()
  project.provide('citusUrl', cluster.url)
  return () => cluster.stop()
}
