// Browser project: real Chromium through Playwright (no browser download; Debian's chromium by default).
// Run through the root scripts/browser-tests.mjs, which skips with a reason when no Chromium exists (and fails under CI).
// A relative import: the config loader bundles relative files, while a workspace package would be loaded as .ts.

import { playwright } from '@vitest/browser-playwright'
import { defineConfig, mergeConfig } from 'vitest/config'
import { chromiumLaunchOptions } from '../../test/support/src/chromium.ts'
import shared from '../../vitest.shared.ts'

export default mergeConfig(
  shared,
  defineConfig({
    test: {
      include: ['test/browser/**/*.browser.test.ts'],
      browser: {
        enabled: true,
        headless: true,
        screenshotFailures: false,
        provider: playwright({
          launchOptions: chromiumLaunchOptions(),
        }),
        instances: [{ browser: 'chromium' }],
      },
    },
  }),
)
