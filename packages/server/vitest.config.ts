import { existsSync } from 'node:fs'
import { defineConfig, mergeConfig } from 'vitest/config'
import shared from '../../vitest.shared.ts'

const PROTOCOLS = ['row', 'lock'] as const

// Every file runs once per reservation protocol (test/helpers.ts reads ONCELY_TEST_RESERVATION), so the engine's
// contract suite and every adapter's tests hold for both. Files that pick their protocols themselves, or do not
// depend on one, run once.
const onePass = [
  'test/protocols.test.ts',
  'test/migrations.test.ts',
  'test/layers/optional-deps.test.ts',
  'test/datasources/sabotage.test.ts',
]

// The engine and HTTP contract suites run a second time per protocol through a real PgBouncer in transaction mode
// (test/pgbouncer-setup.ts), as production Postgres is usually reached. CI installs pgbouncer; elsewhere these
// projects are left out when it is missing.
const throughPooler = ['test/engine.test.ts', 'test/adapters/contract.test.ts']
// The datasource contract (test/datasources/contract.test.ts) runs once more per protocol for every datasource
// other than node-postgres (which the projects above already run it under), named as test/datasources/registry.ts
// names them.
const otherDatasources: string[] = []

const withPooler =
  Boolean(process.env.CI) ||
  [process.env.PGBOUNCER_PATH, '/usr/sbin/pgbouncer', '/usr/bin/pgbouncer'].some((p) => p && existsSync(p))

export default mergeConfig(
  shared,
  defineConfig({
    test: {
      projects: [
        ...PROTOCOLS.map((reservation) => ({
          extends: true as const,
          test: {
            name: reservation,
            include: ['test/**/*.test.ts'],
            exclude: reservation === 'row' ? [] : onePass,
            env: { ONCELY_TEST_RESERVATION: reservation },
          },
        })),
        ...otherDatasources.flatMap((datasource) =>
          PROTOCOLS.map((reservation) => ({
            extends: true as const,
            test: {
              name: `${reservation} on ${datasource}`,
              include: ['test/datasources/contract.test.ts'],
              env: { ONCELY_TEST_RESERVATION: reservation, ONCELY_TEST_DATASOURCE: datasource },
            },
          })),
        ),
        ...(withPooler ? PROTOCOLS : []).map((reservation) => ({
          extends: true as const,
          test: {
            name: `${reservation} via pgbouncer`,
            include: throughPooler,
            globalSetup: ['test/pgbouncer-setup.ts'],
            env: { ONCELY_TEST_RESERVATION: reservation, ONCELY_TEST_POOLER: 'pgbouncer' },
          },
        })),
      ],
    },
  }),
)
