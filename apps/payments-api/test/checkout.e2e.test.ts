/**
 * The checkout page (React, on @oncely/react) in real Chromium against the real API and Postgres: responses are
 * dropped after the server committed, the page is reloaded while the intent is still pending, and the resumed
 * intent must end as exactly one payment and one provider charge, shown on the page and in its ledger panel.
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
import { type Browser, chromium, type Page } from 'playwright'
import { build } from 'vite'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { buildApp } from '../src/app.js'
import { prepareDatabase } from '../src/database.js'
import { createProvider } from '../src/provider.js'
import { count } from './support/app.js'

const hasChromium = requireChromium('checkout e2e')

const checkoutWeb = path.resolve(import.meta.dirname, '../../checkout-web')
const artifacts = path.resolve(import.meta.dirname, '../test-results')

/** Keeps what the page showed at the end of a test, for a person to look at. */
async function saveScreenshot(page: Page, name: string): Promise<void> {
  mkdirSync(artifacts, { recursive: true })
  await page.screenshot({ path: path.join(artifacts, name), fullPage: true })
}

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

      await saveScreenshot(page, 'checkout-resumed-after-reload.png')
    } finally {
      await page.close()
    }
  })

  it('shows on screen that a double click, several lost answers and a reload made one payment and one charge', async () => {
    // A fresh browser context: its own IndexedDB, localStorage and so its own demo tenant, whose ledger starts empty.
    const context = await browser.newContext()
    const page = await context.newPage()
    try {
      await page.goto(baseUrl)
      await page.waitForSelector('body[data-resumed="true"]')
      const tenant = await page.locator('section[data-tenant]').getAttribute('data-tenant')
      expect(tenant).toMatch(/^demo-[a-z0-9]{8}$/)
      const summary = page.locator('#ledger-summary')
      await expect.poll(() => summary.textContent()).toBe('0 attempts, 0 payments, 0 charges')

      await page.check('#flaky')
      await page.dblclick('#pay')
      // The ledger shows the payment the server committed while the page keeps retrying without an answer.
      await expect.poll(() => summary.getAttribute('data-payments'), { timeout: 15_000 }).toBe('1')
      await expect
        .poll(async () => Number(await summary.getAttribute('data-attempts')), { timeout: 20_000 })
        .toBeGreaterThanOrEqual(3)
      const key = await page.locator('#intents tr').first().getAttribute('data-key')
      expect(await page.locator('#intents tr').count()).toBe(1)

      await page.reload()
      const resumed = page.locator(`#intents tr[data-key="${key}"]`)
      await expect.poll(() => resumed.getAttribute('data-state'), { timeout: 20_000 }).toBe('replayed')
      const attempts = Number(await resumed.locator('.attempts').textContent())
      expect(attempts).toBeGreaterThanOrEqual(4)
      await expect
        .poll(() => summary.textContent(), { timeout: 5_000 })
        .toBe(`${attempts} attempts, 1 payment, 1 charge`)
      expect(await summary.getAttribute('data-charges')).toBe('1')

      const { rows } = await db.pool.query<{ id: string; charge_id: string }>(
        'SELECT id, charge_id FROM payments WHERE tenant_id = $1',
        [tenant],
      )
      expect(rows).toHaveLength(1)
      expect(await count(db.pool, 'provider_charges', ['tenant_id', tenant])).toBe(1)
      expect(await page.locator('#ledger-payments').textContent()).toContain(rows[0]!.id)
      expect(await page.locator('#ledger-charges').textContent()).toContain(rows[0]!.charge_id)
      expect(await page.locator('#notice').textContent()).toContain(`payment ${rows[0]!.id}`)

      await saveScreenshot(page, 'checkout-ledger-charged-once.png')
    } finally {
      await context.close()
    }
  })
})
