// CORS in real Chromium, with two real origins on loopback: a page served from one port calls the real API
// (@oncely/server on Postgres behind Fastify) on another, whose CORS setup is right under /good and wrong in one
// way under each other prefix. A wrong setup must end the run at once with a CorsError that names the header to
// fix, not retry as a network error (and leave the intent pending forever), nor misread an answer.
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { fileURLToPath } from 'node:url'
import { createEngine, migrate, postgresStore } from '@oncely/server'
import { fastifyIdempotency } from '@oncely/server/fastify'
import {
  chromiumLaunchOptions,
  createTestDatabase,
  freePort,
  requireChromium,
  waitFor,
} from '@oncely/test-support'
import { build } from 'esbuild'
import Fastify, { type FastifyInstance } from 'fastify'
import { type Browser, chromium, type Page } from 'playwright'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

const hasChromium = requireChromium('client CORS')

/** What each prefix's CORS setup allows and exposes (`undefined`: the header is not sent at all). */
const SETUPS: Record<string, { allowHeaders: string; expose: string | undefined; origin: boolean }> = {
  good: {
    allowHeaders: 'content-type, idempotency-key, oncely-attempt',
    expose: 'idempotent-replayed, retry-after',
    origin: true,
  },
  flaky: {
    allowHeaders: 'content-type, idempotency-key, oncely-attempt',
    expose: 'idempotent-replayed, retry-after',
    origin: true,
  },
  'no-attempt': {
    allowHeaders: 'content-type, idempotency-key',
    expose: 'idempotent-replayed, retry-after',
    origin: true,
  },
  'no-expose': {
    allowHeaders: 'content-type, idempotency-key, oncely-attempt',
    expose: undefined,
    origin: true,
  },
  'no-origin': {
    allowHeaders: 'content-type, idempotency-key, oncely-attempt',
    expose: undefined,
    origin: false,
  },
}

let db: Awaited<ReturnType<typeof createTestDatabase>>
let api: FastifyInstance
let apiUrl: string
let pages: Server
let pageUrl: string
let browser: Browser
const posts: { setup: string; key: string }[] = []
/** How many requests reached the handler: the engine holds the key of each from then until its answer. */
let handled = 0

beforeAll(async () => {
  if (!hasChromium) return
  db = await createTestDatabase('client_cors')
  await migrate(db.pool)
  const engine = createEngine({ store: postgresStore({ pool: db.pool }) })
  api = Fastify({ logger: false })
  api.addHook('onRequest', async (request, reply) => {
    const setup = SETUPS[request.url.split('/')[1] ?? '']
    if (!setup) return
    if (setup.origin) reply.header('access-control-allow-origin', '*')
    if (setup.expose) reply.header('access-control-expose-headers', setup.expose)
    if (request.method === 'OPTIONS') {
      return reply
        .code(204)
        .header('access-control-allow-methods', 'GET, HEAD, POST')
        .header('access-control-allow-headers', setup.allowHeaders)
        .send()
    }
    if (request.method === 'POST') {
      const key = String(request.headers['idempotency-key'])
      const seen = posts.some((p) => p.key === key)
      posts.push({ setup: request.url.split('/')[1]!, key })
      // Under /flaky the first attempt of each key loses its connection (a real network error; CORS is right).
      if (setup === SETUPS.flaky && !seen) request.raw.socket.destroy()
    }
  })
  await api.register(fastifyIdempotency, { engine, tenant: () => 'tenant_1' })
  api.post<{ Body: { amount: number; workMs?: number } }, { idempotency: { required: true } }>(
    '/:setup/v1/payments',
    { config: { idempotency: { required: true } } },
    async (request, reply) => {
      handled++
      const { amount, workMs = 0 } = request.body
      if (workMs > 0) await new Promise((resolve) => setTimeout(resolve, workMs))
      return reply.code(201).send({ amount, at: Date.now() })
    },
  )
  apiUrl = await api.listen({ port: 0, host: '127.0.0.1' })

  const bundle = await build({
    stdin: {
      contents: "import * as oncely from './src/index.ts'\nObject.assign(window, { oncely })",
      resolveDir: fileURLToPath(new URL('../..', import.meta.url)),
      loader: 'ts',
    },
    bundle: true,
    format: 'iife',
    platform: 'browser',
    conditions: ['@oncely/source'],
    write: false,
  })
  const script = bundle.outputFiles[0]!.text
  pages = createServer((request, response) => {
    if (request.url === '/app.js') {
      response.writeHead(200, { 'content-type': 'text/javascript' }).end(script)
      return
    }
    response.writeHead(200, { 'content-type': 'text/html' })
    response.end('<!doctype html><title>checkout</title><script src="/app.js"></script>')
  })
  await new Promise<void>((resolve) => pages.listen(0, '127.0.0.1', resolve))
  pageUrl = `http://127.0.0.1:${(pages.address() as AddressInfo).port}`
  browser = await chromium.launch(chromiumLaunchOptions())
})
afterAll(async () => {
  await browser?.close()
  pages?.close()
  await api?.close()
  await db?.drop()
})

/** What a call in the page ended with, as plain data. */
type Outcome =
  | { ok: true; status: number; source: string; key: string }
  | { ok: false; name: string; corsHeader?: string; headers?: string[]; message: string; pending: number }

/** Sends one payment from the page to `baseUrl`, with a short retry budget. */
function pay(page: Page, baseUrl: string, body: { amount: number; workMs?: number }, intentId?: string) {
  return page.evaluate(
    async ({ baseUrl, body, intentId }): Promise<Outcome> => {
      const { oncely } = window as unknown as { oncely: typeof import('../../src/index.js') }
      const client = oncely.createClient({
        baseUrl,
        store: oncely.memoryStore(),
        retry: { limit: 2, minDelayMs: 50, maxDelayMs: 100 },
        resumeOnOnline: false,
      })
      try {
        const res = await client.request({
          path: 'v1/payments',
          json: body,
          ...(intentId ? { intentId } : {}),
        })
        return { ok: true, status: res.status, source: res.source, key: res.key }
      } catch (error) {
        const e = error as Error & { corsHeader?: string; headers?: string[] }
        return {
          ok: false,
          name: e.name,
          ...(e.name === 'CorsError' ? { corsHeader: e.corsHeader, headers: [...(e.headers ?? [])] } : {}),
          message: e.message,
          pending: (await client.pending()).length,
        }
      }
    },
    { baseUrl, body, intentId },
  )
}

describe.skipIf(!hasChromium)('CORS in Chromium, page and API on two origins', () => {
  let page: Page
  beforeAll(async () => {
    if (!hasChromium) return
    page = await browser.newPage()
    await page.goto(pageUrl)
  })

  it('a right setup: the request goes through, a duplicate waits out the 409 and reads the replay', async () => {
    const before = handled
    const original = pay(page, `${apiUrl}/good/`, { amount: 1, workMs: 1500 }, 'cart:good')
    await waitFor('the original to hold its key', () => handled > before)
    const duplicate = await pay(page, `${apiUrl}/good/`, { amount: 1, workMs: 1500 }, 'cart:good')
    expect(await original).toMatchObject({ ok: true, status: 201, source: 'network' })
    expect(duplicate).toMatchObject({ ok: true, status: 201, source: 'replay' })
  })

  it('Oncely-Attempt missing from Access-Control-Allow-Headers: a CorsError naming it, the intent pending', async () => {
    const outcome = await pay(page, `${apiUrl}/no-attempt/`, { amount: 2 })
    expect(outcome).toMatchObject({
      ok: false,
      name: 'CorsError',
      corsHeader: 'Access-Control-Allow-Headers',
      headers: ['Oncely-Attempt'],
      pending: 1,
    })
    expect(posts.filter((p) => p.setup === 'no-attempt')).toEqual([]) // the preflight stopped every attempt
  })

  it('no Access-Control-Allow-Origin: a CorsError naming it', async () => {
    const outcome = await pay(page, `${apiUrl}/no-origin/`, { amount: 3 })
    expect(outcome).toMatchObject({ ok: false, name: 'CorsError', corsHeader: 'Access-Control-Allow-Origin' })
  })

  it('Retry-After not exposed: the duplicate of a request in flight says so instead of guessing its waits', async () => {
    const before = handled
    const original = pay(page, `${apiUrl}/no-expose/`, { amount: 4, workMs: 1500 }, 'cart:hidden')
    await waitFor('the original to hold its key', () => handled > before)
    const duplicate = await pay(page, `${apiUrl}/no-expose/`, { amount: 4, workMs: 1500 }, 'cart:hidden')
    expect(duplicate).toMatchObject({
      ok: false,
      name: 'CorsError',
      corsHeader: 'Access-Control-Expose-Headers',
      headers: ['Retry-After'],
      pending: 1,
    })
    expect(await original).toMatchObject({ ok: true, status: 201 })
  })

  it('a connection lost with CORS right is a network error, retried as usual, not a CORS error', async () => {
    const outcome = await pay(page, `${apiUrl}/flaky/`, { amount: 6 })
    // The server ran the first attempt and its answer went down with the connection: the retry reads the replay.
    expect(outcome).toMatchObject({ ok: true, status: 201, source: 'replay' })
    const key = (outcome as { key: string }).key
    expect(posts.filter((p) => p.key === key).length).toBeGreaterThanOrEqual(2)
  })

  it('a server that is down is a network error, retried as usual, not a CORS error', async () => {
    const outcome = await pay(page, `http://127.0.0.1:${await freePort()}/`, { amount: 5 })
    expect(outcome).toMatchObject({ ok: false, name: 'RetryExhaustedError', pending: 1 })
    expect((outcome as { message: string }).message).toContain('Network error')
  })
})
