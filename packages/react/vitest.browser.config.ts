// Browser project: the hooks in real Chromium through Playwright (Debian's chromium, no browser download), against
// a real API server started in Node by the global setup, once with React 19 and once with React 18 (the peer range).
// Run through the root scripts/browser-tests.mjs, which skips with a reason when no Chromium exists (and fails
// under CI).
import { playwright } from '@vitest/browser-playwright'
import { defineConfig, mergeConfig } from 'vitest/config'
import { chromiumLaunchOptions } from '../../test/support/src/chromium.ts'
import shared from '../../vitest.shared.ts'

// React 18 is installed as `react-18` and `react-dom-18`: every import of react or react-dom, ours and the test
// libraries', is pointed there.
const react18 = [
  { find: /^react$/, replacement: 'react-18' },
  { find: /^react\/(.*)$/, replacement: 'react-18/$1' },
  { find: /^react-dom$/, replacement: 'react-dom-18' },
  { find: /^react-dom\/(.*)$/, replacement: 'react-dom-18/$1' },
]

export default mergeConfig(
  shared,
  defineConfig({
    // The global setup runs in Node in Vitest's own environment, which does not inherit `ssr.resolve`.
    environments: {
      __vitest__: { resolve: { conditions: ['@oncely/source', 'node', 'module', 'development|production'] } },
    },
    test: {
      include: ['test/browser/**/*.browser.test.tsx'],
      globalSetup: ['test/browser/global-setup.ts'],
      browser: {
        enabled: true,
        headless: true,
        screenshotFailures: false,
        provider: playwright({ launchOptions: chromiumLaunchOptions() }),
        instances: [{ browser: 'chromium' }],
      },
      projects: [
        { extends: true, test: { name: 'react 19' } },
        { extends: true, resolve: { alias: react18 }, test: { name: 'react 18' } },
      ],
    },
  }),
)
