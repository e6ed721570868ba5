/**
 * The checkout page in real Chromium against the real API and Postgres: responses are dropped after the server
 * committed, the page is reloaded while the intent is still pending, and the resumed intent must end as exactly
 * one payment and one provider charge, shown on the page.
 */
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {
  chromiumLaunchOptions,
  createTestDatabase,
  requireChromium,
  type TestDatabase,
} from '@oncely/test-support'
import type { FastifyInstance } from 'fastify'
import { type Browser, chromium } from 'playwright'
import { build } from 'vite'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { buildApp } from '../src/app.js'
import { prepareDatabase } from '../src/database.js'
import { createProvider } from '../src/provider.js'
import { count } from './support/app.js'

const hasChromium = requireChromium('checkout e2e')

const checkoutWeb = path.resolve(import.meta.dirname, '../../checkout-web')
const artifacts = path.resolve(import.meta.dirname, '../test-results')

describe.skipIf(!hasChromium)('checkout page in Chromium', () => {
  let db: TestDatabase
  let app: FastifyInstance
  let browser: Browser
  let webRoot: string
  let baseUrl: string

  beforeAll(async () => {
    // A private build, so a concurrent `pnpm start` and this test never overwrite each other's files.
    webRoot = mkdtempSync(path.join(os.tmpdir(), 'oncely-checkout-'))
    await build({ root: checkoutWeb, logLevel: 'warn', build: { outDir: webRoot, emptyOutDir: true } })
    db = await createTestDatabase('checkout_e2e')
    await prepareDatabase(db.pool)
    // A slow provider keeps each attempt in flight long enough to reload in the middle of the intent.
    const provider = createProvider({ pool: db.pool, delayMs: 300 })
    app = await buildApp({ pool: db.pool, provider, webRoot })
    baseUrl = await app.listen({ port: 0, host: '127.0.0.1' })
    browser = await chromium.launch(chromiumLaunchOptions())
  })

  afterAll(async () => {
    await browser?.close()
    await app?.close()
    await db?.drop()
    if (webRoot) rmSync(webRoot, { recursive: true, force: true })
  })

  it('resumes an intent whose responses were dropped after a reload, and pays exactly once', async () => {
    const page = await browser.newPage()
    try {
      await page.goto(baseUrl)
      await page.waitForSelector('body[data-resumed="true"]')

      await page.check('#flaky')
      await page.click('#pay')
      // The server commits the payment, but the page never sees the answer and keeps the intent pending.
      await expect.poll(() => count(db.pool, 'payments'), { timeout: 15_000 }).toBe(1)
      const row = page.locator('#intents tr').first()
      await expect.poll(() => row.getAttribute('data-state')).toBe('pending')
      const key = await row.getAttribute('data-key')
      expect(key).toMatch(/\S/)
      await expect.poll(() => page.textContent('#pending-count')).toBe('1')

      // Reload mid-flight: the switch is off again, and the page resumes the intent from IndexedDB on load.
      await page.reload()
      const resumed = page.locator(`#intents tr[data-key="${key}"]`)
      await expect.poll(() => resumed.getAttribute('data-state'), { timeout: 20_000 }).toBe('replayed')
      await page.waitForSelector('body[data-resumed="true"]')
      expect(await page.textContent('#pending-count')).toBe('0')

      const { rows } = await db.pool.query<{ id: string; charge_id: string }>(
        'SELECT id, charge_id FROM payments',
      )
      expect(rows).toHaveLength(1)
      expect(await count(db.pool, 'provider_charges')).toBe(1)
      expect(await resumed.locator('.result').textContent()).toContain(rows[0]!.id)
      expect(await resumed.locator('.result').textContent()).toContain(rows[0]!.charge_id)

      mkdirSync(artifacts, { recursive: true })
      await page.screenshot({
        path: path.join(artifacts, 'checkout-resumed-after-reload.png'),
        fullPage: true,
      })
    } finally {
      await page.close()
    }
  })
})
