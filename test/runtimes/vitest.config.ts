import { defineConfig, mergeConfig } from 'vitest/config'
import shared from '../../vitest.shared.ts'

// One file, run once: it builds the Next.js fixture app once and starts each runtime's server once per reservation
// protocol. The hook timeout bounds that build (a cold one takes about 40 s on two cores).
export default mergeConfig(
  shared,
  defineConfig({ test: { include: ['test/**/*.test.ts'], testTimeout: 60_000, hookTimeout: 300_000 } }),
)
