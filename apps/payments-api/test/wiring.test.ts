import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { buildApp } from '../src/app.js'
import type { ChaosPoint } from '../src/config.js'
import { prepareDatabase } from '../src/database.js'
import { createProvider } from '../src/provider.js'
import { count, pay } from './support/app.js'

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('payments_wiring')
})
afterAll(() => db?.drop())

describe('migrations', () => {
  it('apply once when several instances start at the same moment', async () => {
    const results = await Promise.all([1, 2, 3, 4].map(() => prepareDatabase(db.pool)))
    const applied = results.flatMap((result) => result.applied)
    expect(applied.filter((name) => name === 'payments')).toHaveLength(1)
    expect(applied.filter((name) => name === 'outbox')).toHaveLength(1)
    const { rows } = await db.pool.query('SELECT version FROM payments_api_migrations ORDER BY version')
    expect(rows.map((row) => row.version)).toEqual([1, 2, 3, 4, 5])
  })
})

describe('the public API', () => {
  it("is all the demo loads: @oncely/server/testing only through the chaos suite's dynamic import", () => {
    const root = new URL('../src/', import.meta.url)
    const files = readdirSync(root, { recursive: true, encoding: 'utf8' }).filter((name) =>
      name.endsWith('.ts'),
    )
    const sources = new Map(files.map((name) => [name, readFileSync(new URL(name, root), 'utf8')]))
    const testing = [...sources].filter(([, text]) => text.includes("from '@oncely/server/testing'"))
    expect(testing.map(([name]) => name)).toEqual(['fault-injection.ts'])
    for (const [name, text] of sources) {
      // A static import of the module would load the testing entry on every start.
      expect(/^import[^;]*'\.\/fault-injection\.js'/m.test(text), name).toBe(false)
    }
    expect(sources.get('app.ts')).toContain("await import('./fault-injection.js')")
  })
})

describe('fault points', () => {
  it('are reached in protocol order on a successful payment', async () => {
    const reached: ChaosPoint[] = []
    const app = await buildApp({
      pool: db.pool,
      webRoot: false,
      faults: { at: async (point) => void reached.push(point) },
    })
    try {
      const res = await pay(app, { amount: 100, currency: 'eur' })
      expect(res.statusCode).toBe(201)
      // onResponse runs after the reply is written; give it its turn.
      await new Promise((resolve) => setImmediate(resolve))
      expect(reached).toEqual([
        'after-reserve',
        'after-provider',
        'after-business-write',
        'before-commit',
        'after-commit',
        'after-reply',
      ])
    } finally {
      await app.close()
    }
  })
})

describe('concurrent duplicates', () => {
  it('execute once: one 201, the others 409 with Retry-After, and a single charge', async () => {
    const app = await buildApp({
      pool: db.pool,
      webRoot: false,
      provider: createProvider({ pool: db.pool, delayMs: 300 }),
    })
    try {
      const responses = await Promise.all(
        [1, 2, 3, 4, 5].map(() =>
          pay(app, { amount: 700, currency: 'usd' }, { tenant: 'racer', key: 'same-key' }),
        ),
      )
      const statuses = responses.map((res) => res.statusCode).sort()
      expect(statuses).toEqual([201, 409, 409, 409, 409])
      for (const res of responses.filter((r) => r.statusCode === 409)) {
        expect(res.headers['retry-after']).toMatch(/^\d+$/)
        expect(res.json()).toMatchObject({ code: 'request_in_progress' })
      }
      expect(await count(db.pool, 'provider_charges', ['tenant_id', 'racer'])).toBe(1)
      expect(await count(db.pool, 'payments', ['tenant_id', 'racer'])).toBe(1)
    } finally {
      await app.close()
    }
  })
})

describe('checkout page', () => {
  let root: string
  beforeAll(() => {
    root = mkdtempSync(path.join(os.tmpdir(), 'oncely-web-'))
    mkdirSync(path.join(root, 'assets'))
    writeFileSync(path.join(root, 'index.html'), '<!doctype html><title>checkout</title>')
    writeFileSync(path.join(root, 'assets', 'app-1234.js'), 'console.log(1)')
    writeFileSync(path.join(os.tmpdir(), 'oncely-secret.txt'), 'secret')
  })
  afterAll(() => {
    rmSync(root, { recursive: true, force: true })
    rmSync(path.join(os.tmpdir(), 'oncely-secret.txt'), { force: true })
  })

  it('serves index.html at / and hashed assets with a long cache, and nothing outside its root', async () => {
    const app = await buildApp({ pool: db.pool, webRoot: root })
    try {
      const page = await app.inject({ url: '/' })
      expect(page.statusCode).toBe(200)
      expect(page.headers['content-type']).toBe('text/html; charset=utf-8')
      expect(page.headers['cache-control']).toBe('no-cache')
      const asset = await app.inject({ url: '/assets/app-1234.js' })
      expect(asset.statusCode).toBe(200)
      expect(asset.headers['content-type']).toBe('text/javascript; charset=utf-8')
      expect(asset.headers['cache-control']).toContain('immutable')
      const outside = await app.inject({ url: '/assets/..%2F..%2Foncely-secret.txt' })
      expect(outside.statusCode).toBe(404)
      expect((await app.inject({ url: '/assets/missing.js' })).statusCode).toBe(404)
    } finally {
      await app.close()
    }
  })

  it('says how to build the page when it is missing', async () => {
    const app = await buildApp({ pool: db.pool, webRoot: path.join(root, 'nope') })
    try {
      const page = await app.inject({ url: '/' })
      expect(page.statusCode).toBe(503)
      expect(page.body).toContain('pnpm --filter @oncely/checkout-web build')
    } finally {
      await app.close()
    }
  })
})
