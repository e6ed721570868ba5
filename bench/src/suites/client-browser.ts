// Client cost of write-ahead persistence in real Chromium: the page POSTs one mutation at a time with plain
// `fetch` (a key header, nothing persisted) and with the oncely client on `indexedDbStore` at relaxed and strict
// durability. Page, bundle and API come from one local server (same origin, no CORS preflight), which answers
// 201 at once without a database, so the difference is the client's own work. Rounds rotate the order as in the
// Node client suite; the timing runs in the page (see ../browser/page.ts). The floors, timed in the same rounds,
// are a bare IndexedDB put of an intent-sized record at each durability in the same page.
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { fileURLToPath } from 'node:url'
import { chromiumLaunchOptions, chromiumPath } from '@oncely/test-support'
import { build } from 'esbuild'
import { chromium, type Page } from 'playwright'
import type { BenchPage, BrowserSender } from '../browser/page.js'
import { percentile } from '../stats.js'
import { type ClientSummary, summarize } from './client.js'
import type { ResumeResult } from './scale.js'

const SENDERS: BrowserSender[] = [
  'fetch',
  'indexedDbStore relaxed',
  'indexedDbStore strict',
  'IndexedDB put relaxed',
  'IndexedDB put strict',
  'IndexedDB put strict, then fetch',
]

async function bundle(): Promise<string> {
  const result = await build({
    entryPoints: [fileURLToPath(new URL('../browser/page.ts', import.meta.url))],
    bundle: true,
    format: 'iife',
    platform: 'browser',
    conditions: ['@oncely/source'],
    write: false,
  })
  return result.outputFiles[0]!.text
}

async function serve(script: string): Promise<{ server: Server; url: string }> {
  const server = createServer((request, response) => {
    request.resume()
    request.on('end', () => {
      if (request.method === 'POST' && request.url === '/ledger') {
        response.writeHead(201, { 'content-type': 'application/json' })
        response.end('{"id":"1","account":"acct-42","amount":1250}')
      } else if (request.url === '/app.js') {
        response.writeHead(200, {
          'content-type': 'text/javascript',
          'cross-origin-resource-policy': 'same-origin',
        })
        response.end(script)
      } else {
        // Cross-origin isolated, so the page's performance.now() has a resolution of 5 µs instead of 100 µs.
        response.writeHead(200, {
          'content-type': 'text/html',
          'cross-origin-opener-policy': 'same-origin',
          'cross-origin-embedder-policy': 'require-corp',
        })
        response.end('<!doctype html><title>oncely bench</title><script src="/app.js"></script>')
      }
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/` }
}

const inPage = (page: Page, sender: BrowserSender, count: number) =>
  page.evaluate(([s, n]) => (window as unknown as { oncelyBench: BenchPage }).oncelyBench.timed(s, n), [
    sender,
    count,
  ] as const)

/**
 * Runs the Chromium client rounds and, when `resumeIntents` is above 0, one `resume()` of that many pending
 * intents in a strict indexedDbStore. Returns nothing (and logs why) when Chromium is not installed.
 */
export async function browserClientBench(options: {
  rounds: number
  requestsPerRound: number
  resumeIntents: number
  log: (line: string) => void
}): Promise<{ client: ClientSummary[]; resume: ResumeResult[] }> {
  const launch = chromiumLaunchOptions()
  const { server, url } = await serve(await bundle())
  let browser: Awaited<ReturnType<typeof chromium.launch>> | undefined
  try {
    browser = await chromium.launch(launch)
  } catch (error) {
    server.close()
    options.log(`  Chromium client bench skipped: cannot launch ${chromiumPath()}: ${String(error)}`)
    return { client: [], resume: [] }
  }
  try {
    const page = await browser.newPage()
    await page.goto(url)
    for (const sender of SENDERS) await inPage(page, sender, Math.min(200, options.requestsPerRound))
    const rounds: Record<string, number[]>[] = []
    for (let round = 0; round < options.rounds; round++) {
      const result: Record<string, number[]> = {}
      for (let i = 0; i < SENDERS.length; i++) {
        const sender = SENDERS[(i + round) % SENDERS.length]!
        result[sender] = await inPage(page, sender, options.requestsPerRound)
      }
      rounds.push(result)
      options.log(
        `  chromium round ${round + 1}: ${SENDERS.map((s) => `${s} p50 ${percentile(result[s]!, 50).toFixed(3)} ms`).join(', ')}`,
      )
    }
    const resume: ResumeResult[] = []
    if (options.resumeIntents > 0) {
      const { seconds, settled } = await page.evaluate(
        (n) => (window as unknown as { oncelyBench: BenchPage }).oncelyBench.resumeTime(n),
        options.resumeIntents,
      )
      resume.push({ store: 'indexedDbStore', intents: options.resumeIntents, seconds, settled })
      options.log(
        `  chromium indexedDbStore: ${options.resumeIntents} intents resumed in ${seconds.toFixed(2)} s`,
      )
    }
    return {
      client: summarize(
        rounds,
        ['fetch', 'indexedDbStore relaxed', 'indexedDbStore strict', 'IndexedDB put strict, then fetch'],
        'fetch',
        'chromium',
      ),
      resume,
    }
  } finally {
    await browser.close()
    server.close()
  }
}
