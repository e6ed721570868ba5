import { defineConfig, mergeConfig } from 'vitest/config'
import shared from '../../vitest.shared.ts'

// Node project. The real-Chromium project is vitest.browser.config.ts (run by the root scripts/browser-tests.mjs).
export default mergeConfig(
  shared,
  defineConfig({
    test: { include: ['test/**/*.test.ts'], exclude: ['test/browser/**', '**/node_modules/**'] },
  }),
)
