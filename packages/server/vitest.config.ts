import { defineConfig, mergeConfig } from 'vitest/config'
import shared from '../../vitest.shared.ts'

// Every file runs once per reservation protocol (test/helpers.ts reads ONCELY_TEST_RESERVATION), so the engine's
// contract suite and every adapter's tests hold for both. Files that pick their protocols themselves, or do not
// depend on one, run once.
const onePass = ['test/protocols.test.ts', 'test/migrations.test.ts', 'test/layers/optional-deps.test.ts']

export default mergeConfig(
  shared,
  defineConfig({
    test: {
      projects: (['row', 'lock'] as const).map((reservation) => ({
        extends: true,
        test: {
          name: reservation,
          include: ['test/**/*.test.ts'],
          exclude: reservation === 'row' ? [] : onePass,
          env: { ONCELY_TEST_RESERVATION: reservation },
        },
      })),
    },
  }),
)
