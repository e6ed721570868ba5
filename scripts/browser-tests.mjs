#!/usr/bin/env node
// Runs the browser test project (vitest.browser.config.ts) of the package it is run in, in real Chromium. Without a
// Chromium binary the tests are skipped with a one-line reason, except under CI, where a missing browser is a
// failure (so CI can never pass without running them).
import { spawnSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'

const chromium = process.env.CHROMIUM_PATH || '/usr/bin/chromium'
if (!existsSync(chromium)) {
  const reason = `no Chromium at ${chromium} (set CHROMIUM_PATH)`
  if (process.env.CI) {
    console.error(`browser tests FAILED: ${reason}; CI must run them`)
    process.exit(1)
  }
  console.log(`browser tests skipped: ${reason}`)
  process.exit(0)
}
const vitest = join(dirname(createRequire(import.meta.url).resolve('vitest/package.json')), 'vitest.mjs')
const result = spawnSync(
  process.execPath,
  [vitest, 'run', '--config', 'vitest.browser.config.ts', ...process.argv.slice(2)],
  {
    stdio: 'inherit',
  },
)
if (result.error) throw result.error
process.exit(result.status ?? 1)
