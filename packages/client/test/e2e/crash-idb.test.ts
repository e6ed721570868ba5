// indexedDbStore against real crashes in Chromium: a page runs one scenario of the client (write-ahead, send,
// settle, give up, discard, resume) and is frozen, then closed, at one moment, every moment of the scenario in turn
// (each IndexedDB write issued and committed, the first attempt about to go, the request in flight, its answer
// received, the answer given). A new page on the same origin then checks what the database holds against what the
// closed page's caller had been told, with the same promises as fileStore's crash test:
//
// - an intent whose write-ahead was acknowledged is never lost, unless the server gave its final answer;
// - an intent whose answer the caller had, or that it discarded, never comes back as pending nor is sent again;
// - a torn or aborted write is never read.
//
// Closing the whole browser (a persistent context, relaunched on the same profile) is checked at the moments that
// matter most: right after the write-ahead, and right after the answer.
import { mkdtemp, rm } from 'node:fs/promises'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { chromiumLaunchOptions, requireChromium } from '@oncely/test-support'
import { build } from 'esbuild'
import { type Browser, type BrowserContext, chromium, type Page } from 'playwright'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { Harness } from './fixtures/crash-page.js'
import { expectNothingResent, expectPromisesKept, type Fact } from './support/promises.js'

const hasChromium = requireChromium('indexedDbStore crash test')

let server: Server
let url: string
let browser: Browser
let databases = 0
// Every key the server received, and the keys it gave a final answer to (a 201 written out).
const received: string[] = []
const answered = new Set<string>()
const attempts = new Map<string, number>()

beforeAll(async () => {
  if (!hasChromium) return
  const bundle = await build({
    entryPoints: [fileURLToPath(new URL('./fixtures/crash-page.ts', import.meta.url))],
    bundle: true,
    format: 'iife',
    platform: 'browser',
    conditions: ['@oncely/source'],
    write: false,
    logLevel: 'silent',
  })
  const script = bundle.outputFiles[0]!.text
  // POST /pay?fail=N answers 503 to the first N attempts of a key, then 201.
  server = createServer((request, response) => {
    request.resume()
    request.on('end', () => {
      if (request.method !== 'POST') {
        const page = request.url === '/app.js'
        response.writeHead(200, {
          'content-type': page ? 'text/javascript' : 'text/html',
          'cache-control': 'no-store',
        })
        response.end(page ? script : '<!doctype html><title>oncely</title><script src="/app.js"></script>')
        return
      }
      const key = String(request.headers['idempotency-key'])
      received.push(key)
      const count = (attempts.get(key) ?? 0) + 1
      attempts.set(key, count)
      const fail = Number(new URL(request.url!, 'http://x').searchParams.get('fail') ?? 0)
      const status = count <= fail ? 503 : 201
      if (status === 201) response.on('finish', () => answered.add(key))
      response.writeHead(status, { 'content-type': 'application/json' })
      response.end(JSON.stringify({ key }))
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`
  browser = await chromium.launch(chromiumLaunchOptions())
}, 60_000)
afterAll(async () => {
  await browser?.close()
  server?.close()
})

// Opens the harness page and starts a scenario in it; resolves with the page and what it reports until it froze
// (or finished).
async function start(
  context: BrowserContext,
  db: string,
  scenario: string,
  stopAt?: { moment: string; occurrence: number },
): Promise<{ page: Page; facts: Fact[] }> {
  const page = await context.newPage()
  const facts: Fact[] = []
  let settle!: () => void
  const ended = new Promise<void>((resolve) => {
    settle = resolve
  })
  page.on('console', (message) => {
    const text = message.text()
    if (!text.startsWith('oncely:')) return
    const fact = JSON.parse(text.slice('oncely:'.length)) as Fact
    facts.push(fact)
    if (fact.frozen || fact.done) settle()
  })
  await page.goto(url)
  void page
    .evaluate((config) => (window as unknown as PageWindow).harness.start(config), {
      db,
      scenario,
      ...(stopAt ? { stopAt } : {}),
    })
    .catch(() => {}) // a frozen page never answers; closing it rejects this
  await Promise.race([
    ended,
    new Promise((_, reject) =>
      setTimeout(() => reject(new Error(`${scenario} never froze or finished`)), 20_000),
    ),
  ])
  return { page, facts }
}

type PageWindow = { harness: Harness }

// Checks what the database holds against what the closed page's caller had been told; then resume() in a new page
// must not send anything that was answered or discarded.
async function check(context: BrowserContext, db: string, facts: Fact[], where: string) {
  const page = await context.newPage()
  await page.goto(url)
  const list = await page.evaluate((name) => (window as unknown as PageWindow).harness.records(name), db)
  expectPromisesKept(facts, new Map(list.map((r) => [r.id, r])), answered, where)
  const sentBefore = received.length
  await page.evaluate((name) => (window as unknown as PageWindow).harness.resume(name), db)
  expectNothingResent(facts, new Set(received.slice(sentBefore)), where)
  await page.close()
}

const scenarios: { name: string; pendingFirst: boolean }[] = [
  { name: 'one-off', pendingFirst: false },
  { name: 'named', pendingFirst: false },
  { name: 'pending', pendingFirst: false },
  { name: 'discard', pendingFirst: true },
  { name: 'resume', pendingFirst: true },
]

describe.skipIf(!hasChromium)('indexedDbStore, its page closed at every moment', () => {
  for (const { name, pendingFirst } of scenarios) {
    it(`${name}: the store keeps its promises whichever moment the page closes at`, async () => {
      const context = await browser.newContext()
      // A database with an intent left pending by a page that gave up on it, when the scenario needs one.
      const prepare = async () => {
        const db = `crash-${name}-${databases++}`
        if (!pendingFirst) return { db, before: [] }
        const { page, facts } = await start(context, db, 'pending')
        await page.close()
        // What the setup page's caller was told counts too: its intent was written ahead, and not answered.
        return { db, before: facts.filter((fact) => fact.ack) }
      }
      const traced = await prepare()
      const trace = await start(context, traced.db, name)
      await trace.page.close()
      const moments = trace.facts.filter((fact) => fact.moment)
      expect(moments.length).toBeGreaterThan(1)
      expect(moments.map((fact) => fact.moment)).toContain(name === 'discard' ? 'discarded' : 'put committed')
      for (const { moment, occurrence } of moments) {
        const { db, before } = await prepare()
        const stopAt = { moment: String(moment), occurrence: Number(occurrence) }
        const { page, facts } = await start(context, db, name, stopAt)
        await page.close()
        await check(context, db, [...before, ...facts], `${name}, page closed at ${moment} #${occurrence}`)
      }
      await context.close()
    }, 180_000)
  }

  it('closing the whole browser right after a write-ahead or right after an answer keeps the same promises', async () => {
    const profile = await mkdtemp(join(tmpdir(), 'oncely-profile-'))
    try {
      for (const stop of ['attempt', 'answered']) {
        const db = `crash-browser-${stop.replace(' ', '-')}`
        let context = await chromium.launchPersistentContext(profile, chromiumLaunchOptions())
        const { facts } = await start(context, db, 'one-off', { moment: stop, occurrence: 1 })
        await context.close() // the browser goes, with the frozen page in it
        context = await chromium.launchPersistentContext(profile, chromiumLaunchOptions())
        await check(context, db, facts, `browser closed at ${stop}`)
        await context.close()
      }
    } finally {
      await rm(profile, { recursive: true, force: true })
    }
  }, 120_000)
})
