// Browser project: real Chromium through Playwright (no browser download; Debian's chromium by default).
// Run through scripts/browser-tests.mjs, which skips with a reason when no Chromium exists (and fails under CI).
import { playwright } from '@vitest/browser-playwright'
import { defineConfig, mergeConfig } from 'vitest/config'
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
          launchOptions: {
            executablePath: process.env.CHROMIUM_PATH || '/usr/bin/chromium',
            args: [
              '--no-sandbox',
              '--disable-gpu',
              '--disable-background-networking',
              '--disable-component-update',
              '--disable-sync',
              '--no-first-run',
            ],
          },
        }),
        instances: [{ browser: 'chromium' }],
      },
    },
  }),
)
