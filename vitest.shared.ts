// Shared Vitest settings. Workspace packages resolve to their `src` through the `@oncely/source` export condition
// (mirrored in tsconfig `customConditions`), so no test ever runs against a stale `dist`.
import { defineConfig } from 'vitest/config'

export const sourceConditions = ['@oncely/source']

export default defineConfig({
  resolve: { conditions: [...sourceConditions, 'module', 'browser', 'development|production'] },
  ssr: { resolve: { conditions: [...sourceConditions, 'node', 'module', 'development|production'] } },
  test: {
    testTimeout: 30_000,
    hookTimeout: 60_000,
  },
})
