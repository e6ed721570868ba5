import { defineConfig, mergeConfig } from 'vitest/config'
import shared from '../../vitest.shared.ts'

// Node project (React Native-like: no DOM). The real-Chromium project is vitest.browser.config.ts.
export default mergeConfig(
  shared,
  defineConfig({
    test: { include: ['test/**/*.test.{ts,tsx}'], exclude: ['test/browser/**', '**/node_modules/**'] },
  }),
)
