// Real pages in real Chromium, driven by Playwright from Node: a page bundling the client talks to a real local
// server (@oncely/server on Postgres, same origin), is really reloaded, and two pages resume one intent at once.
import { fileURLToPath } from 'node:url'
import { chromiumLaunchOptions, requireChromium } from '@oncely/test-support'
import { build } from 'esbuild'
import { type Browser, chromium, type Page } from 'playwright'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startOncelyServer } from '../support/oncely-server.js'

const hasChromium = requireChromium('client browser pages')

let server: Awaited<ReturnType<typeof startOncelyServer>>
let browser: Browser

beforeAll(async () => {
  if (!hasChromium) return
  server = await startOncelyServer('client_browser_pages')
  const bundle = await build({
    stdin: {
      contents:
        "import { createClient } from './src/index.ts'\nimport { indexedDbStore } from './src/stores/idb.ts'\nObject.assign(window, { oncely: { createClient, indexedDbStore } })",
      resolveDir: fileURLToPath(new URL('../..', import.meta.url)),
      loader: 'ts',
    },
    bundle: true,
    format: 'iife',
    platform: 'browser',
    conditions: ['@oncely/source'],
    write: false,
  })
  server.files.set('/app.js', { type: 'text/javascript', body: bundle.outputFiles[0]!.text })
  server.files.set('/', {
    type: 'text/html',
    body: '<!doctype html><title>oncely</title><script src="/app.js"></script>',
  })
  browser = await chromium.launch(chromiumLaunchOptions())
})
afterAll(async () => {
  await browser?.close()
  await server?.close()
})

interface PageApi {
  oncely: typeof import('../../src/index.js') & typeof import('../../src/stores/idb.js')
  client: import('../../src/index.js').OncelyClient
}

// Creates a client in the page: IndexedDB store, fast retries, no automatic resume (the test decides when).
async function openClient(page: Page, dbName: string): Promise<void> {
  await page.evaluate((name) => {
    const w = window as unknown as PageApi
    w.client = w.oncely.createClient({
      baseUrl: location.origin,
      store: w.oncely.indexedDbStore({ name }),
      retry: { limit: 1000, minDelayMs: 20, maxDelayMs: 100, maxElapsedMs: 600_000 },
      timeoutMs: 2000,
      resumeOnOnline: false,
    })
  }, dbName)
}

async function until(check: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 20_000
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

describe.skipIf(!hasChromium)('pages in Chromium', () => {
  it('an intent written to IndexedDB survives a real page reload, and resume() completes it with the same key', async () => {
    server.keys.length = 0
    server.dropResponses = true
    const page = await browser.newPage()
    await page.goto(server.url)
    await openClient(page, 'reload')
    // Fire and forget: the server commits and drops every response, so the page keeps retrying until reloaded.
    await page.evaluate(() => {
      void (window as unknown as PageApi).client
        .request({ path: '/v1/payments', json: { amount: 42 } })
        .catch(() => {})
    })
    await until(() => server.keys.length >= 2, 'two dropped attempts')
    await page.reload()
    server.dropResponses = false
    await openClient(page, 'reload')
    const pending = await page.evaluate(() => (window as unknown as PageApi).client.pending())
    const key = server.keys[0]!
    expect(pending).toMatchObject([{ key, state: 'pending' }])
    const outcomes = await page.evaluate(async () => {
      const outcomes = await (window as unknown as PageApi).client.resume()
      return outcomes.map((o) => ({
        outcome: o.outcome,
        key: o.key,
        ...(o.outcome === 'settled' ? { status: o.response.status, replayed: o.response.replayed } : {}),
      }))
    })
    expect(outcomes).toEqual([{ outcome: 'settled', key, status: 201, replayed: true }])
    expect(new Set(server.keys)).toEqual(new Set([key]))
    expect(await server.effects()).toBe(1)
    expect(await page.evaluate(() => (window as unknown as PageApi).client.pending())).toEqual([])
    await page.close()
  })

  it('two pages of one origin resuming the same pending intent at once make exactly one effect', async () => {
    const effectsBefore = await server.effects()
    server.unavailable = true // the first attempt gets 503 and no effect: the intent stays pending
    const context = await browser.newContext()
    const [one, two] = [await context.newPage(), await context.newPage()]
    for (const page of [one, two]) {
      await page.goto(server.url)
      await openClient(page, 'two-pages')
    }
    const error = await one.evaluate(async () => {
      const w = window as unknown as PageApi
      const client = w.oncely.createClient({
        baseUrl: location.origin,
        store: w.oncely.indexedDbStore({ name: 'two-pages' }),
        retry: { limit: 0 },
        resumeOnOnline: false,
      })
      return client.request({ path: '/v1/payments', json: { amount: 1 } }).then(
        () => 'settled',
        (e: Error) => e.name,
      )
    })
    expect(error).toBe('RetryExhaustedError')
    server.unavailable = false
    server.workMs = 300 // keep the first resume in flight while the other page tries
    server.keys.length = 0
    const results = await Promise.all(
      [one, two].map((page) =>
        page.evaluate(async () =>
          (await (window as unknown as PageApi).client.resume()).map((o) => o.outcome),
        ),
      ),
    )
    server.workMs = 0
    expect(results.flat().filter((o) => o === 'settled')).toHaveLength(1)
    expect(server.keys).toHaveLength(1)
    expect((await server.effects()) - effectsBefore).toBe(1)
    await context.close()
  })
})
