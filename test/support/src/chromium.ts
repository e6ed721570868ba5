/**
 * Where the browser tests find Chromium, and what they do without it: Debian's build at `/usr/bin/chromium` (or
 * `CHROMIUM_PATH`), never a Playwright download. Missing outside CI: the tests are skipped with a one-line reason.
 * Missing under CI: an error, so CI can never pass without running them.
 */
import { existsSync } from 'node:fs'

/** Flags for headless Chromium on a machine with no outside network (background networking would be refused). */
export const CHROMIUM_ARGS: readonly string[] = [
  '--no-sandbox',
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
]

/** The Chromium binary the browser tests use. */
export function chromiumPath(): string {
  return process.env.CHROMIUM_PATH || '/usr/bin/chromium'
}

/**
 * True when Chromium is installed. Throws under `CI` when it is not; elsewhere prints one line saying what `suite`
 * skips and why.
 *
 * @example
 * const hasChromium = requireChromium('checkout e2e')
 * describe.skipIf(!hasChromium)('checkout page in Chromium', () => { ... })
 */
export function requireChromium(suite: string): boolean {
  const path = chromiumPath()
  if (existsSync(path)) return true
  if (process.env.CI) throw new Error(`${suite}: no Chromium at ${path} (set CHROMIUM_PATH); CI must run it`)
  console.warn(`${suite} skipped: no Chromium at ${path} (set CHROMIUM_PATH)`)
  return false
}

/** Playwright launch options for the test Chromium: `chromium.launch(chromiumLaunchOptions())`. */
export function chromiumLaunchOptions(): { executablePath: string; headless: true; args: string[] } {
  return { executablePath: chromiumPath(), headless: true, args: [...CHROMIUM_ARGS] }
}
