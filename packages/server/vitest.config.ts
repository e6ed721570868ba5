import { existsSync } from 'node:fs'
import { defineConfig, mergeConfig } from 'vitest/config'
import shared from '../../vitest.shared.ts'

const PROTOCOLS = ['row', 'lock'] as const

// Every file runs under the default protocol (`lock`). The contract suites, and the files that hold a protocol's own
// mechanics (its crash, lease, fencing, pool and pooler behaviour), run under `row` as well (test/helpers.ts reads
// ONCELY_TEST_RESERVATION): what an adapter, a layer's API or an option check does is the same under both, and
// running it twice only lengthens the suite. Files that pick their protocols themselves run once, under `lock`.
const underEveryProtocol = [
  'test/engine.test.ts',
  'test/adapters/contract.test.ts',
  'test/datasources/contract.test.ts',
  'test/datasources/pglite.test.ts',
  'test/concurrency.test.ts',
  'test/connection-kill.test.ts',
  'test/pg-restart.test.ts',
  'test/pool-exhaustion.test.ts',
  'test/lease.test.ts',
  'test/lease-keeping.test.ts',
  'test/faults.test.ts',
  'test/replay-cache.test.ts',
  'test/statements.test.ts',
  'test/pooler.test.ts',
  'test/shard-routing.test.ts',
  'test/layers/steps.test.ts',
  'test/layers/consumer-kill.test.ts',
  'test/layers/inbox-tenant.test.ts',
  'test/layers/redis.test.ts',
  'test/otel/telemetry.test.ts',
]

// The engine and HTTP contract suites run a second time per protocol through a real PgBouncer in transaction mode
// (test/pgbouncer-setup.ts), as production Postgres is usually reached. CI installs pgbouncer; elsewhere these
// projects are left out when it is missing.
const throughPooler = ['test/engine.test.ts', 'test/adapters/contract.test.ts']
// The datasource contract (test/datasources/contract.test.ts) runs once more per protocol for every datasource
// other than node-postgres (which the projects above already run it under), named as test/datasources/registry.ts
// names them.
const otherDatasources: string[] = [
  'postgres-js',
  'drizzle-node-postgres',
  'drizzle-postgres-js',
  'kysely',
  'knex',
  'typeorm',
  'prisma',
  'pglite',
]

const withPooler =
  Boolean(process.env.CI) ||
  [process.env.PGBOUNCER_PATH, '/usr/sbin/pgbouncer', '/usr/bin/pgbouncer'].some((p) => p && existsSync(p))

// The engine and HTTP contract suites, and the questions only a distributed key table raises (test/citus), run on a
// real Citus cluster per protocol (test/citus-setup.ts: a coordinator and two workers of Debian's PostgreSQL 15 with
// Citus), with the key table, the outbox and the business tables distributed by tenant. CI builds Citus (.ci/run);
// elsewhere these projects are left out, with a line saying why, when it is missing.
const onCitus = [
  'test/engine.test.ts',
  'test/adapters/contract.test.ts',
  'test/shard-routing.test.ts',
  'test/layers/inbox-tenant.test.ts',
  'test/citus/**/*.test.ts',
]
// The files of test/citus that pick their protocols themselves, or do not depend on one, run once.
const citusOnePass = ['test/citus/reaper.test.ts', 'test/citus/outbox.test.ts']
const citusBindir = process.env.CITUS_PG_BINDIR || '/usr/lib/postgresql/15/bin'
const citusMissing = !existsSync(`${citusBindir}/postgres`)
  ? `no PostgreSQL server at ${citusBindir}`
  : !existsSync(`${citusBindir}/../lib/citus.so`)
    ? `Citus is not installed into ${citusBindir}/../lib (no citus.so)`
    : undefined
const withCitus = Boolean(process.env.CI) || !citusMissing
if (!withCitus) console.warn(`@oncely/server: the tests on a Citus cluster are left out: ${citusMissing}`)

export default mergeConfig(
  shared,
  defineConfig({
    test: {
      // The Prisma client the Prisma datasource's tests use is generated, not committed.
      globalSetup: ['test/datasources/prisma/setup.ts'],
      projects: [
        ...PROTOCOLS.map((reservation) => ({
          extends: true as const,
          test: {
            name: reservation,
            include: reservation === 'lock' ? ['test/**/*.test.ts'] : underEveryProtocol,
            exclude: ['test/citus/**'],
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
        ...(withCitus ? PROTOCOLS : []).map((reservation) => ({
          extends: true as const,
          test: {
            name: `${reservation} on citus`,
            include: onCitus,
            exclude: reservation === 'row' ? [] : citusOnePass,
            globalSetup: ['test/citus-setup.ts'],
            env: { ONCELY_TEST_RESERVATION: reservation, ONCELY_TEST_CITUS: '1' },
          },
        })),
      ],
    },
  }),
)
